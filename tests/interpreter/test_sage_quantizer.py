"""flashcheck's emulation of SageAttention 1.0.6's quantizer (flashcheck.numerics.sage) against the package's own
Triton quantizers, ``sageattention.core.per_block_int8`` and ``per_block_int8_hd96``, under the Triton interpreter:
the int8 codes and the bits of the fp32 scales, equal, for fp16, bf16 and fp32 inputs, head dims 64, 96 and 128,
sequences on and off the block grid, all-zero blocks, an outlier, quotients on the half-integers, NaN and infinite
values, a subnormal scale, and K smoothed as ``sageattn`` smooths it (in place, on the caller's tensor).

The package's quantizers take CPU tensors under the interpreter; ``sageattn`` itself asserts ``q.is_cuda``, so the
smoothing test runs it with ``is_cuda`` patched to True and stops it once it has quantized."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.numerics.sage import K_BLOCK, L2E, Q_BLOCK, sage_quantize

pytestmark = [pytest.mark.interpreter,
              # an all-zero block's 0 / 0 and its NaN's cast to int8, which numpy reports under the interpreter
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")]  # a block of NaN only

pytest.importorskip("triton")
sageattention = pytest.importorskip("sageattention")
core = sageattention.core

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
LENGTHS = (1, 63, 64, 65, 127, 128, 129, 300)


def package_quantizer(q: torch.Tensor, k: torch.Tensor, scale: float | None = None):
    """The package's codes and scales (its scales as (B, H, blocks), without the trailing 1)."""
    quantize = core.per_block_int8_hd96 if q.shape[-1] == 96 else core.per_block_int8
    q_codes, q_scales, k_codes, k_scales = quantize(q, k, sm_scale=scale)
    return q_codes, q_scales[..., 0], k_codes, k_scales[..., 0]


def assert_bit_exact(q: torch.Tensor, k: torch.Tensor, scale: float | None = None):
    """The emulation (K not smoothed: the package's quantizer does not smooth) gives the package's codes and scale
    bits; returns the emulation's record."""
    got = sage_quantize(q, k, k, scale=scale, smooth_k=False)
    want = package_quantizer(q, k, scale)
    for name, mine, theirs in zip(("q codes", "q scales", "k codes", "k scales"),
                                  (got.q_codes, got.q_scales, got.k_codes, got.k_scales), want):
        assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, name
        same = mine.view(torch.int32) == theirs.view(torch.int32) if mine.is_floating_point() else mine == theirs
        assert bool(same.all()), (name, int((~same).sum()), mine[~same][:5], theirs[~same][:5])
    return got


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("d", (64, 96, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_random_inputs_give_the_packages_codes_and_scales(dtype, d, n):
    g = torch.Generator().manual_seed(1000 * d + n)
    q = (torch.randn(1, 2, n, d, generator=g) * 3).to(DTYPES[dtype])
    k = (torch.randn(1, 2, n, d, generator=g) * torch.rand(1, 2, 1, d, generator=g) * 5).to(DTYPES[dtype])
    assert_bit_exact(q, k)


@pytest.mark.parametrize("d", (64, 96, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_all_zero_blocks_get_scale_zero_and_codes_zero(dtype, d):
    q = torch.randn(1, 2, 300, d).to(DTYPES[dtype])
    k = torch.randn(1, 2, 300, d).to(DTYPES[dtype])
    q[:, :, Q_BLOCK:2 * Q_BLOCK] = 0  # Q's second block
    k[:, :, K_BLOCK:2 * K_BLOCK] = 0  # K's second block
    got = assert_bit_exact(q, k)
    assert bool((got.q_scales[:, :, 1] == 0).all() and (got.k_scales[:, :, 1] == 0).all())
    assert not got.q_codes[:, :, Q_BLOCK:2 * Q_BLOCK].any() and not got.k_codes[:, :, K_BLOCK:2 * K_BLOCK].any()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_one_huge_outlier_takes_the_block(dtype):
    big = 60000.0 if dtype == "fp16" else 1e30
    q = torch.randn(1, 1, 130, 64).to(DTYPES[dtype])
    k = torch.randn(1, 1, 130, 64).to(DTYPES[dtype])
    q[0, 0, 5, 7] = big
    k[0, 0, 70, 3] = -big
    got = assert_bit_exact(q, k)
    assert got.q_codes[0, 0, 5, 7] == 127 and got.k_codes[0, 0, 70, 3] == -127
    # every other code of the two blocks rounds to 0
    assert got.q_codes[0, 0, :Q_BLOCK].count_nonzero() == 1
    assert got.k_codes[0, 0, K_BLOCK:2 * K_BLOCK].count_nonzero() == 1


def half_integers(dtype: torch.dtype) -> tuple[list[float], list[int]]:
    """Values x with y = x exactly where the block's largest magnitude is 127 (scale 1.0): the half-integers,
    which round away from zero, and the largest value under 0.5 of the dtype, which float32's add of 0.5 takes
    to 1.0 when it is 0.49999997 (fp32) and leaves under 1 otherwise."""
    under_half = torch.nextafter(torch.tensor(0.5, dtype=dtype), torch.tensor(0.0, dtype=dtype)).item()
    values = [127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, under_half, -under_half]
    quirk = 1 if dtype == torch.float32 else 0  # 0.49999997 + 0.5 is 1 - 2^-25, a tie that rounds to 1.0
    return values, [127, 1, -1, 2, -2, 3, -3, 127, -127, quirk, -quirk]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_quotients_on_half_integers_round_away_from_zero(dtype):
    values, codes = half_integers(DTYPES[dtype])
    x = torch.zeros(1, 1, 130, 64, dtype=DTYPES[dtype])
    x[0, 0, 0, :len(values)] = torch.tensor(values, dtype=DTYPES[dtype])
    # the multiplier sm_scale * L2E rounds to 1.0 in fp32 when sm_scale is 1 / L2E: Q's y is x too
    got = assert_bit_exact(x, x, scale=1 / L2E)
    assert got.multiplier == 1.0 and got.q_scales[0, 0, 0].item() == got.k_scales[0, 0, 0].item() == 1.0
    assert got.q_codes[0, 0, 0, :len(values)].tolist() == codes
    assert got.k_codes[0, 0, 0, :len(values)].tolist() == codes
    # the half-integers, and 0.49999997 (fp32), are where a GPU's approximate division may move a code
    near = got.k_ambiguous[0, 0, 0, :len(values)].tolist()
    assert near == [False] + [True] * 8 + [dtype == "fp32"] * 2


def test_nan_in_k_counts_for_no_max_and_gets_code_zero():
    k = torch.randn(1, 2, 129, 64)
    k[0, 0, 3, 5] = k[0, 1, 100, 0] = math.nan
    k[0, 1, 64:128] = math.nan  # a block of NaN only: scale NaN
    q = torch.randn(1, 2, 129, 64)
    got = assert_bit_exact(q, k)
    assert got.k_codes[0, 0, 3, 5] == 0 and got.k_codes[0, 1, 100, 0] == 0 and math.isnan(got.k_scales[0, 1, 1])
    assert got.k_scales[0, 0, 0] == k[0, 0, :64].nan_to_num(0).abs().max() / 127


def test_infinity_makes_its_blocks_scale_infinite_and_codes_zero():
    k = torch.randn(1, 1, 100, 128, dtype=torch.float16)
    k[0, 0, 10, 10] = math.inf
    got = assert_bit_exact(k.clone(), k)
    assert math.isinf(got.k_scales[0, 0, 0]) and not got.k_codes[0, 0, :K_BLOCK].any()


def test_a_subnormal_scale_lets_codes_wrap_as_the_interpreter_casts():
    k = torch.zeros(1, 1, 64, 64)
    k[0, 0, 0, :3] = torch.tensor([180, 100, -2000], dtype=torch.float64).mul(2.0**-149).float()
    k[0, 0, 1, :3] = torch.tensor([180, 100, 1], dtype=torch.float64).mul(2.0**-149).float()
    k2 = k.clone()
    k2[0, 0, 0, 2] = 0.0  # second head: the largest magnitude 180 ulps, scale 1 ulp
    got = assert_bit_exact(torch.randn(1, 1, 64, 64), torch.cat([k, k2], dim=1))
    assert got.k_codes[0, 1, 0, :2].tolist() == [-76, 100]  # y = 180.5 truncates to 180, whose low byte is -76


@pytest.mark.parametrize("d", (64, 96, 128))
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_smoothing_is_sageattns_which_mutates_the_callers_k(dtype, d, monkeypatch):
    g = torch.Generator().manual_seed(d)
    q = torch.randn(1, 2, 100, d, generator=g).to(DTYPES[dtype])
    k = (torch.randn(1, 2, 100, d, generator=g) + 40).to(DTYPES[dtype])  # a large mean: smoothing matters
    v = torch.randn(1, 2, 100, d, generator=g).to(DTYPES[dtype])
    before = [t.clone() for t in (q, k, v)]
    got = sage_quantize(q, k, v)
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before))  # the emulation leaves its inputs alone
    want = run_sageattn_until_quantized(q, k, v, monkeypatch)
    assert not torch.equal(k, before[1]) and torch.equal(k, before[1] - before[1].mean(dim=2, keepdim=True))
    assert all(torch.equal(mine, theirs) for mine, theirs in
               zip((got.q_codes, got.q_scales, got.k_codes, got.k_scales), want))
    unsmoothed = sage_quantize(q, before[1], v, smooth_k=False)
    assert not torch.equal(unsmoothed.k_codes, got.k_codes)


class Quantized(Exception):
    """Raised by the patched quantizer to stop ``sageattn`` before its attention kernel."""


def run_sageattn_until_quantized(q, k, v, monkeypatch):
    """The codes and scales ``sageattn`` computes (smooth_k=True), from its own code path: ``is_cuda`` patched to
    True for its device assertion, its quantizer wrapped to record the result and stop."""
    record = {}

    def recording(wrapped):
        def quantize(*args, **kwargs):
            q_codes, q_scales, k_codes, k_scales = wrapped(*args, **kwargs)
            record["result"] = (q_codes, q_scales[..., 0], k_codes, k_scales[..., 0])
            raise Quantized
        return quantize

    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    for name in ("per_block_int8", "per_block_int8_hd96"):
        monkeypatch.setattr(core, name, recording(getattr(core, name)))
    with pytest.raises(Quantized):
        sageattention.sageattn(q, k, v)
    monkeypatch.undo()
    return record["result"]
