"""SageAttention 1.0.6's quantizer as flashcheck emulates it (flashcheck.numerics.sage), on hand-built values and
without the package: half away from zero through a float32 add, all-zero, NaN and infinite blocks, the codes a GPU
may give one apart, exact dequantized values, shapes off the block grid, the multiplier's literal, K's smoothing
and V's cast. tests/interpreter/test_sage_quantizer.py audits it bit for bit against the package's kernels."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from flashcheck.errors import InvalidArgument
from flashcheck.numerics.sage import (AMBIGUITY_ULPS, K_BLOCK, L2E, Q_BLOCK, ambiguous, near_half,
                                      quantize_blocks, sage_quantize, smooth_k)

F32 = torch.float32
UNDER_HALF = 0.5 - 2.0**-25  # 0.49999997, the largest float32 under 0.5


def one_block(values: list[float], dtype: torch.dtype = F32) -> torch.Tensor:
    """A (1, 1, 64, 64) tensor holding ``values`` first, then zeros: K's first block."""
    x = torch.zeros(1, 1, K_BLOCK, 64, dtype=dtype)
    x.view(-1)[:len(values)] = torch.tensor(values, dtype=dtype)
    return x


def test_codes_round_half_away_from_zero_through_a_float32_add():
    # 127 makes the scale 1.0, so y is each value itself
    values = [127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, UNDER_HALF, -UNDER_HALF, 0.25, 1.4999999,
              -0.0, 0.0]
    codes, scales = quantize_blocks(one_block(values), K_BLOCK, 1.0)
    assert scales.item() == 1.0
    # torch.round would give 0, 0, 2, 2, 126 for 0.5, 1.5, 2.5, 126.5: ties go away from zero here; and the
    # float32 sum 0.49999997 + 0.5 is 1 - 2^-25, a tie that rounds to 1.0, so 0.49999997 gives 1
    assert codes.view(-1)[:len(values)].tolist() == [127, 1, -1, 2, -2, 3, -3, 127, -127, 1, -1, 0, 1, 0, 0]
    assert torch.round(torch.tensor([0.5, 1.5, 2.5, 126.5])).tolist() == [0, 2, 2, 126]


def test_the_multiplier_is_rounded_to_float32_and_multiplies_in_float32():
    x = one_block([127.0, 3.0])
    codes, scales = quantize_blocks(x, K_BLOCK, 1 / L2E)  # 1 / L2E rounds to a float32 under 1: a is x times it
    m = torch.tensor(1 / L2E, dtype=F32)
    assert scales.item() == ((127.0 * m) / torch.tensor(127.0)).item()
    assert codes.view(-1)[:2].tolist() == [127, 3]


def test_an_all_zero_block_gets_scale_zero_and_codes_zero():
    x = torch.randn(1, 2, 200, 64)
    x[:, 1, K_BLOCK:2 * K_BLOCK] = 0
    x[0, 1, 70, 3] = -0.0
    codes, scales = quantize_blocks(x, K_BLOCK, 1.0)
    assert scales[0, 1, 1].item() == 0 and not codes[0, 1, K_BLOCK:2 * K_BLOCK].any()
    assert bool((scales[:, 0] > 0).all() and (scales[0, 1, [0, 2, 3]] > 0).all())


def test_nan_counts_for_no_max_and_gets_code_zero():
    x = one_block([63.5, math.nan, -127.0, 1.0])
    x[0, 0, 5, 5] = math.nan
    codes, scales = quantize_blocks(x, K_BLOCK, 1.0)
    assert scales.item() == 1.0 and codes.view(-1)[:4].tolist() == [64, 0, -127, 1] and codes[0, 0, 5, 5] == 0
    everywhere = torch.full((1, 1, K_BLOCK, 64), math.nan)  # NaN only: the kernel's maxnum is NaN there too
    codes, scales = quantize_blocks(everywhere, K_BLOCK, 1.0)
    assert math.isnan(scales.item()) and not codes.any()


def test_an_infinity_makes_its_blocks_scale_infinite_and_every_code_zero():
    codes, scales = quantize_blocks(one_block([math.inf, 100.0, -3.0]), K_BLOCK, 1.0)
    assert math.isinf(scales.item()) and not codes.any()
    record = sage_quantize(torch.randn(1, 1, 10, 64), one_block([-math.inf]), torch.zeros(1, 1, K_BLOCK, 64),
                           smooth_k=False)
    assert bool(record.dequantized().k.isnan().all())  # 0 * inf, as the kernel's score is


def test_a_subnormal_scale_lets_a_code_wrap():
    ulp = 2.0**-149  # largest magnitude 180 float32 ulps: its scale 180 / 127 ulps rounds to 1 ulp, so y = 180
    codes, scales = quantize_blocks(one_block([180 * ulp, 100 * ulp, -60 * ulp]), K_BLOCK, 1.0)
    assert scales.item() == ulp and codes.view(-1)[:3].tolist() == [180 - 256, 100, -60]
    codes, scales = quantize_blocks(one_block([ulp]), K_BLOCK, 1.0)  # scale 0: y = inf, past int32's range
    assert scales.item() == 0 and not codes.any()


def test_the_ambiguity_window_marks_exactly_the_quotients_near_a_half_integer():
    for half in (0.5, 1.5, 2.5, 63.5, 100.5, 126.5):
        center = torch.tensor(half, dtype=F32)
        ulp = (torch.nextafter(center, torch.tensor(math.inf)) - center).item()
        steps = range(-AMBIGUITY_ULPS - 4, AMBIGUITY_ULPS + 5)
        for sign in (1, -1):
            y = sign * (center.double() + torch.tensor([k * ulp for k in steps], dtype=torch.float64)).float()
            # under 0.5 float32's ulp is half 0.5's: the window below it is half as many of 0.5's ulps
            want = [abs(k) <= (AMBIGUITY_ULPS // 2 if half == 0.5 and k < 0 else AMBIGUITY_ULPS) for k in steps]
            assert near_half(y).tolist() == want, (half, sign)
    far = torch.tensor([0.0, -0.0, 0.3, 1.0, -7.0, 127.0, 126.9, math.nan, math.inf])
    assert not near_half(far).any()


def test_ambiguous_marks_the_block_quotients_near_a_half_integer():
    x = one_block([127.0, 0.5, 1.5 + 2.0**-20, 1.5 + 2.0**-15, 10.0, -UNDER_HALF])
    assert ambiguous(x, K_BLOCK, 1.0).view(-1)[:6].tolist() == [False, True, True, False, False, True]
    record = sage_quantize(torch.randn(2, 2, 130, 96), torch.randn(2, 1, 70, 96), torch.randn(2, 1, 70, 96))
    assert record.q_ambiguous.shape == record.q_codes.shape and record.k_ambiguous.shape == record.k_codes.shape


def test_dequantized_values_are_the_exact_products():
    q, k = torch.randn(1, 2, 200, 64) * 5, torch.randn(1, 2, 200, 64) * 1e-3
    record = sage_quantize(q, k, torch.randn(1, 2, 200, 64), scale=0.3)
    values = record.dequantized()
    for codes, scales, block, got in ((record.q_codes, record.q_scales, Q_BLOCK, values.q),
                                      (record.k_codes, record.k_scales, K_BLOCK, values.k)):
        assert got.dtype == torch.float64 and got.shape == codes.shape
        for b, h, n, d in [(0, 0, 0, 0), (0, 1, 199, 63), (0, 1, 130, 7), (0, 0, 64, 1)]:
            exact = Fraction(int(codes[b, h, n, d])) * Fraction(scales[b, h, n // block].item())
            assert Fraction(got[b, h, n, d].item()) == exact
        # where float32 holds the product (codes 0, +-1, +-2 among others), float32's product is the same number;
        # elsewhere (most codes of 2 or more bits) only float64 holds it
        per_token = scales.repeat_interleave(block, dim=2)[:, :, :codes.shape[2], None]
        fits = got.float().double() == got
        assert bool(fits[codes.abs() <= 2].all()) and not bool(fits.all())
        assert torch.equal(got[fits], (codes.float() * per_token)[fits].double())
    assert torch.equal(values.v, record.v.double())


@pytest.mark.parametrize("n", (1, 63, 64, 65, 127, 128, 129, 300))
def test_shapes_off_the_block_grid(n):
    q, k = torch.randn(2, 4, n, 128, dtype=torch.float16), torch.randn(2, 2, n, 128, dtype=torch.float16)
    record = sage_quantize(q, k, k)
    assert record.q_codes.shape == (2, 4, n, 128) and record.q_codes.dtype == torch.int8
    assert record.q_scales.shape == (2, 4, -(-n // 128)) and record.q_scales.dtype == F32
    assert record.k_codes.shape == (2, 2, n, 128) and record.k_scales.shape == (2, 2, -(-n // 64))
    assert record.dequantized().q.shape == (2, 4, n, 128)


def test_the_multiplier_is_the_packages_literal_rounded_to_float32():
    q = torch.randn(1, 1, 4, 96)
    record = sage_quantize(q, q, q)
    assert record.multiplier == torch.tensor(96**-0.5 * 1.44269504, dtype=F32).item()
    assert record.multiplier != torch.tensor(96**-0.5 * math.log2(math.e), dtype=F32).item()  # true log2 e differs
    assert sage_quantize(q, q, q, scale=0.5).multiplier == torch.tensor(0.5 * 1.44269504, dtype=F32).item()


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
def test_k_is_smoothed_in_its_dtype_and_no_input_is_touched(dtype):
    q, k, v = (torch.randn(1, 2, 100, 64) + 30).to(dtype), (torch.randn(1, 2, 100, 64) + 30).to(dtype), \
        torch.randn(1, 2, 100, 64).to(dtype)
    before = [t.clone() for t in (q, k, v)]
    smoothed = smooth_k(k)
    want = k.clone()
    want -= want.mean(dim=2, keepdim=True)  # sageattn's two lines, in place on its copy
    assert smoothed.dtype == dtype and torch.equal(smoothed, want)
    record = sage_quantize(q, k, v)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))
    assert torch.equal(record.k_codes, quantize_blocks(want, K_BLOCK, 1.0)[0])
    assert not torch.equal(record.k_codes, sage_quantize(q, k, v, smooth_k=False).k_codes)


def test_v_is_cast_to_fp16_ties_to_even_and_overflowing_to_infinity():
    v = torch.tensor([1 + 2.0**-11, 65504.0, 65520.0, -1e6, 1 + 3 * 2.0**-11], dtype=F32).reshape(1, 1, 5, 1)
    record = sage_quantize(torch.randn(1, 1, 5, 64), torch.randn(1, 1, 5, 64), v)
    assert record.v.dtype == torch.float16
    assert record.v.view(-1).tolist() == [1.0, 65504.0, math.inf, -math.inf, 1 + 4 * 2.0**-11]


def test_arguments_it_refuses():
    x = torch.randn(1, 1, 8, 64)
    with pytest.raises(InvalidArgument, match="head dim"):
        sage_quantize(torch.randn(1, 1, 8, 80), torch.randn(1, 1, 8, 80), torch.randn(1, 1, 8, 80))
    with pytest.raises(InvalidArgument, match="one dtype"):
        sage_quantize(x, x.half(), x)
    with pytest.raises(InvalidArgument, match="4-D"):
        quantize_blocks(x[0], K_BLOCK, 1.0)
    with pytest.raises(InvalidArgument, match="4-D"):
        smooth_k(x.double())
