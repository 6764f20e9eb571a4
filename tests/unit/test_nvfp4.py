"""NVFP4: the scheme's contract and its refusals, its e2m1 codes' rounding and 4-bit encoding audited bit for bit on a
dense float32 grid against a table built from the format's bit layout (torch has the packed dtype
float4_e2m1fn_x2 but no cast to it), its block scales against torch's e4m3 cast, and its cases in every block regime.
The references and planted bugs run with the other block-scaled schemes' (test_block_scales.py)."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.contract.quantization import SCHEMES, Blocks, Scheme
from flashcheck.contract.spec import KernelSpec
from flashcheck.contract.validation import Shapes
from flashcheck.features.quantized import stray_codes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.quantization import BLOCK_REGIMES, DESCALE_REGIMES, block_regime, rescaled_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.numerics import nvfp4
from flashcheck.numerics.budget import contract_terms
from flashcheck.numerics.quantizers import round_to

F64 = torch.float64
# e2m1 from its bit layout, code = s ee m: (-1)^s * (e == 0 ? m / 2 : (1 + m / 2) * 2^(e - 1))
TABLE = torch.tensor([(-1.0) ** (c >> 3) * ((c & 1) / 2 if (c >> 1) & 3 == 0 else (1 + (c & 1) / 2) * 2.0 ** (((c >> 1) & 3) - 1))
                      for c in range(16)], dtype=F64)


def nearest_codes(x: torch.Tensor) -> torch.Tensor:
    """The 4-bit code of the e2m1 value nearest each float32 value of ``x`` (finite or infinite), ties to the even
    code (mantissa bit 0), past 6 saturating: exact, as |x| is clamped to 8 first (which keeps the answer 6)."""
    a = x.float().double().abs().clamp(max=8.0)
    distance = (a[:, None] - TABLE[:8].abs()[None, :]).abs()  # exact: few bits each
    nearest = distance == distance.min(1, keepdim=True).values
    even = torch.arange(8) % 2 == 0
    magnitude = torch.where(nearest & even, 2, nearest.long()).argmax(1)  # among two at a tie, the even one
    return magnitude + 8 * torch.signbit(x).long()


def dense_grid() -> torch.Tensor:
    """Every float32 whose bits are a multiple of 2^12 (both signs, every exponent: 2^20 values), the midpoints of e2m1's
    neighbours and one float32 ulp either side, the saturation edge, +-0 and +-inf; NaN apart."""
    bits = torch.arange(0, 2**32, 2**12, dtype=torch.int64).to(torch.int32)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 2.0**-149, 3.4e38, math.inf, 0.0])
    near = torch.cat([ties, torch.nextafter(ties, ties + 1), torch.nextafter(ties, ties - 1)])
    x = torch.cat([bits.view(torch.float32), near, -near])
    return x[~torch.isnan(x)]


def test_the_scheme_names_its_codes_and_its_global_scale_and_refuses_what_cannot_hold():
    scheme = SCHEMES["nvfp4"]
    assert (scheme.codes, scheme.global_scale, scheme.descales, scheme.compute) == ("e2m1", True, False, "bf16")
    assert [(b.size, b.axis, b.format) for b in scheme.blocks] == [(16, "dims", "e4m3")] * 2 + [(16, "columns", "e4m3")]
    assert scheme.text().startswith("nvfp4: e2m1 codes; q e4m3 per 16 dims") and "fp32 global scale" in scheme.text()
    assert KernelSpec(dtypes=("fp8_e4m3",), quantization="nvfp4").quantization is scheme
    terms = contract_terms("flash", "fp8_e4m3", scheme)  # P stays in bf16, the compute format: no requantization
    assert (terms.u_p, terms.u_in, terms.u_v, terms.s_p, terms.scale_ulps) == (2.0**-8, 2.0**-8, 2.0**-8, 2.0**-126, 3.0)
    refusals = [(lambda: Scheme("x", codes="e3m2"), "codes='e3m2'"),
                (lambda: Scheme("x", global_scale=True), "global_scale=True.*descales=False"),
                (lambda: KernelSpec(dtypes=("fp8_e4m3", "fp8_e5m2"), quantization="nvfp4"), "dtypes=.*fp8_e4m3")]
    for call, message in refusals:
        with pytest.raises(flashcheck.InvalidArgument, match=message):
            call()


def test_e2m1_rounding_and_its_packed_encoding_are_exact_on_a_dense_float32_grid():
    x = dense_grid()
    want = nearest_codes(x)
    values = round_to(x.double(), "e2m1")
    assert torch.equal(values, TABLE[want]) and torch.equal(torch.signbit(values), want >= 8)  # -0.0 is code 8
    packed = nvfp4.pack(values)
    assert packed.dtype == torch.float4_e2m1fn_x2 and packed.shape == (len(x) // 2,)
    bits = packed.view(torch.uint8).long()
    assert torch.equal(bits & 15, want[0::2]) and torch.equal(bits >> 4, want[1::2])  # element 2i low (c10's layout)
    back = nvfp4.unpack(packed).double()
    assert torch.equal(back, values) and torch.equal(torch.signbit(back), torch.signbit(values))
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, math.inf, -math.inf, -1e-30], dtype=F64)
    assert round_to(ties, "e2m1").tolist() == [0, 1, 1, 2, 2, 4, 4, -4, 6, 6, -6, 0]


def test_e2m1_has_no_nan_so_the_encoding_refuses_it_and_any_other_value():
    assert math.isnan(round_to(torch.tensor([math.nan], dtype=F64), "e2m1").item())  # rounding passes NaN on
    for bad in ([math.nan, 1.0], [0.25, 1.0], [8.0, 1.0]):
        with pytest.raises(flashcheck.InvalidArgument, match="not an e2m1 code"):
            nvfp4.pack(torch.tensor(bad, dtype=F64))
    with pytest.raises(flashcheck.InvalidArgument, match="odd last dim"):
        nvfp4.pack(torch.zeros(3, dtype=F64))


def test_the_quantizers_scales_are_torchs_e4m3_cast_and_its_codes_the_nearest():
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 16, generator=g) * torch.exp2(torch.randint(-30, 10, (64, 1), generator=g).float())).double()
    x[3] = 0.0  # an all-zero block: scale 0, codes 0
    glob = nvfp4.global_scale(x, "e4m3")
    assert glob.item() == (x.abs().max() / 2688).float().item()
    amax = x.abs().amax(-1, keepdim=True)
    scales = nvfp4.block_scales(amax, glob, "e4m3")
    assert torch.equal(scales, (amax / (6 * glob)).to(torch.float8_e4m3fn).double())
    assert scales.max().item() == 448 and scales[3].item() == 0 and bool(((scales > 0) & (scales < 2**-6)).any())
    assert nvfp4.block_scales(torch.tensor([1e6], dtype=F64), torch.tensor(1.0, dtype=F64), "e4m3").item() == 448
    codes = nvfp4.codes(x, scales * glob)
    quotient = torch.where(scales > 0, x / (scales * glob), 0.0).float().flatten()
    assert torch.equal(codes.flatten(), TABLE[nearest_codes(quotient)].abs() * torch.sign(quotient))
    assert codes.abs().max().item() == 6 and torch.equal(codes[3], torch.zeros(16, dtype=F64))


def _case(regime: str, *, d=40, n_k=70):
    seed = next(s for s in range(100) if block_regime(s) == regime and s % len(DESCALE_REGIMES) == 0)
    return Recipe(shapes=Shapes(2, 4, 2, 5, n_k, d, 24), dtype="fp8_e4m3", values="random", causal="bottom_right",
                  seed=seed, settings={"quantization": "nvfp4"}).build()


def test_cases_are_e2m1_codes_with_e4m3_block_scales_and_a_global_scale_per_tensor_in_every_block_regime():
    cases = {regime: _case(regime) for regime in BLOCK_REGIMES}
    for regime, case in cases.items():
        v = case.variant
        assert all(not stray_codes(t, "e2m1").numel() for t in (case.q, case.k, case.v)), regime
        assert [tuple(s.shape) for s in v.block_scales] == [(2, 4, 5, 3), (2, 2, 70, 3), (2, 2, 5, 24)]  # 40 = 16+16+8
        assert all(torch.equal(s.to(torch.float8_e4m3fn).float(), s) for s in v.block_scales), regime
        assert bool((v.descales == v.descales[:, :1, :1]).all()) and bool((v.descales != 1).all()), regime
        kwargs = v.kwargs()
        assert kwargs["k_global_scale"].shape == () and "k_descale" not in kwargs and \
            kwargs["k_block_scales"].dtype == torch.float8_e4m3fn
        codes = case.k.float().view(2, 2, 70, -1)
        assert codes.abs().max().item() == 6, regime  # each block's largest code reaches 6, or saturates there
    zero = cases["zero_blocks"].variant.k_block_scales
    assert bool((zero == 0).any())
    tiny = torch.cat([s.flatten() for s in cases["tiny_scales"].variant.block_scales])
    assert bool(((tiny > 0) & (tiny < 2.0**-6)).any())  # e4m3's subnormals
    outlier = cases["outlier"].k.float().abs()
    assert bool((outlier == 0).any()) and bool((outlier == 6).any())  # the rest of a block beside its outlier falls to 0


def test_the_oracle_attends_codes_times_block_scales_times_the_global_scale():
    case = _case("identical")
    v = case.variant
    by_hand = [t.double() * s.double().repeat_interleave(16, axis)[tuple(slice(0, n) for n in t.shape)] * d[0, 0]
               for t, s, d, axis in zip((case.q, case.k, case.v), v.block_scales, v.descales.double(), (3, 3, 2))]
    assert all(torch.equal(a, b) for a, b in zip(v.dequantized(case.q, case.k, case.v), by_hand))


def test_codes_outside_e2m1_and_global_scales_that_differ_within_a_tensor_are_refused_by_name():
    case = _case("amax")
    with pytest.raises(flashcheck.InvalidArgument, match=r"k=.*not e2m1 codes"):
        AttentionCase.create(case.q, (case.k.float() * 1.25).to(torch.float8_e4m3fn), case.v, scale=case.scale,
                             variant=case.variant)
    with pytest.raises(flashcheck.InvalidArgument, match="q=.*float8_e4m3fn"):
        AttentionCase.create(*(t.to(torch.float8_e5m2) for t in (case.q, case.k, case.v)), scale=case.scale,
                             variant=case.variant)
    uneven = case.variant.descales.clone()
    uneven[1, 0, 0] *= 2
    with pytest.raises(flashcheck.InvalidArgument, match="descales.*one global scale per tensor"):
        case.variant.replace(descales=uneven)


def test_e2m1_codes_without_a_global_scale_are_rescaled_only_where_they_stay_codes():
    scheme = Scheme("e2m1_kv", k=Blocks(16, "dims", "e4m3"), v=Blocks(16, "columns", "e4m3"), codes="e2m1")
    codes = torch.tensor([[[[0.5, 1.5, 3.0, -2.0]]]])
    variant = flashcheck.Variant(descales=torch.ones(3, 1, 1), quantization=scheme,
                                 k_block_scales=torch.ones(1, 1, 1, 1), v_block_scales=torch.ones(1, 1, 1, 4))
    q = codes.to(torch.float8_e4m3fn)
    k = torch.tensor([[[[4.0, 6.0, 1.0, 0.0]]]]).to(torch.float8_e4m3fn)  # halved exactly, not doubled
    case = AttentionCase.create(q, k, q.clone(), scale=0.5, variant=variant)
    what, rescaled = rescaled_case(case)
    assert "q times 2" in what and "k times 0.5" in what and not stray_codes(rescaled.k, "e2m1").numel()


def test_a_saved_nvfp4_case_round_trips_and_replays(tmp_path, capsys):
    import json

    from flashcheck.cli.main import main

    case = _case("zero_blocks")
    _, saved = case.save(tmp_path / "case")
    back = AttentionCase.load(saved)
    assert back.equal_bits(case) and json.loads(saved.read_text())["variant"]["quantization"] == "nvfp4"
    assert main(["replay", str(saved), "--kernel", "torch:nvfp4~global_scale_forgotten", "--device", "cpu"]) == 1
    assert main(["replay", str(saved), "--kernel", "torch:nvfp4", "--device", "cpu"]) == 0
    assert "quantization error (the inputs' quantization" in capsys.readouterr().out
