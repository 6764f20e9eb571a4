"""FlashInfer's and vLLM's fp8 KV cache beside an unquantized q: the ``per_tensor_kv`` schemes (k and v e4m3 or e5m2
codes held in q's fp16 or bf16, one fp32 scale per tensor) and their refusals, the oracle on the exact codes times
scales, the budget's terms, the drawn cases in every regime, ``torch:fp8-kv-tensor`` and its planted bugs caught."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from flashcheck import InvalidArgument, KernelSpec
from flashcheck.contract.quantization import SCHEMES, Blocks, Scheme
from flashcheck.contract.validation import Shapes
from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.quantization import BLOCK_REGIMES, block_regime, rescaled_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.check import check
from flashcheck.kernels.planted import FP8_KV_TENSOR
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.budget import contract_terms

from tests._planted import first_catching_case

NAME, SCHEME, E5M2 = "torch:fp8-kv-tensor", SCHEMES["per_tensor_kv"], SCHEMES["per_tensor_kv_e5m2"]
SHAPES = Shapes(2, 4, 2, 5, 37, 32, 24)


def _case(regime: str = "amax", dtype: str = "fp16", scheme: str = "per_tensor_kv", shapes: Shapes = SHAPES):
    seed = next(s for s in range(100) if block_regime(s) == regime)
    return Recipe(shapes, dtype, causal="bottom_right", seed=seed, settings={"quantization": scheme}).build()


def test_the_schemes_hold_k_and_v_codes_in_q_dtype_with_one_scale_each():
    for scheme, codes in ((SCHEME, "fp8_e4m3"), (E5M2, "fp8_e5m2")):
        assert (scheme.held_codes, scheme.quantized, scheme.tensor_scales, scheme.descales) == (codes, "kv", True, False)
        assert scheme.holds_codes("fp16") and scheme.holds_codes("bf16") and not scheme.holds_codes(codes)
        assert KernelSpec(dtypes=("bf16",), quantization=scheme.name).quantization is scheme


@pytest.mark.parametrize("make, argument, words", [
    (lambda: KernelSpec(dtypes=("fp8_e4m3",), quantization="per_tensor_kv"), "dtypes", "fp16 or bf16 inputs"),
    (lambda: KernelSpec(dtypes=("fp32",), quantization="per_tensor_kv_e5m2"), "dtypes", "fp8_e5m2 codes"),
    (lambda: Scheme("mine", quantized="kv"), "quantized", "compute format"),
    (lambda: Scheme("mine", quantized="vk", held_codes="fp8_e4m3", compute="input", descales=False,
                    global_scale=True), "quantized", "in order"),
    (lambda: Scheme("mine", quantized="kv", held_codes="fp8_e4m3", compute="input", descales=False), "held_codes",
     "need a scale"),
    (lambda: Scheme("mine", q=Blocks(16), quantized="kv", held_codes="fp8_e4m3", compute="bf16", descales=False),
     "quantized", "q has block scales"),
    (lambda: Scheme("mine", compute="fp8_e4m3"), "compute", "unknown"),
])
def test_a_scheme_or_spec_that_cannot_carry_the_cache_is_refused_by_name(make, argument, words):
    with pytest.raises(InvalidArgument) as raised:
        make()
    assert raised.value.argument == argument and words in str(raised.value) and raised.value.fix


@pytest.mark.parametrize("scheme, fp8", [(SCHEME, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_the_oracle_attends_each_code_times_its_tensor_scale_exactly(scheme, fp8):
    """Every finite code of the cache's format, held in fp16, times fp32 scales that are no power of two."""
    byte = torch.arange(256, dtype=torch.uint8).view(fp8)
    codes = byte[torch.isfinite(byte.float())][:240].float().view(1, 1, 8, 30)
    k, v = codes.half(), codes.flip(-1).half()
    scales = torch.tensor([1.0, 5.0 / 3, 2.0**-120 / 3]).float().view(3, 1, 1)
    variant = Variant(descales=scales, quantization=scheme)
    case = AttentionCase.create(torch.randn(1, 2, 3, 30).half(), k, v, scale=0.1, variant=variant)
    q, kd, vd = case.variant.dequantized(case.q, case.k, case.v)
    for got, c, s in ((kd, codes, scales[1]), (vd, codes.flip(-1), scales[2])):
        want = [Fraction(float(x)) * Fraction(float(s)) for x in c.double().flatten().tolist()]
        assert [Fraction(x) for x in got.flatten().tolist()] == want
    assert torch.equal(q, case.q.double())
    assert set(case.variant.kwargs()) >= {"k_scale", "v_scale"} and "q_scale" not in case.variant.kwargs()
    with pytest.raises(InvalidArgument, match="not fp8_e"):
        case.variant.dequantized(case.q, case.k * 1.01, case.v)


def test_the_budget_takes_half_inputs_p_in_q_dtype_and_the_output_rounded_twice():
    for dtype, u in (("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        terms = contract_terms("flash", dtype, SCHEME)
        assert (terms.u_in, terms.u_p, terms.u_o, terms.scale_ulps) == (u, u, (1 + u) ** 2 - 1, 2.0)
    assert contract_terms("flash", "fp8_e4m3", SCHEME) == contract_terms("flash", "fp8_e4m3")


@pytest.mark.parametrize("regime", BLOCK_REGIMES)
def test_the_reference_passes_in_every_regime(regime):
    case = _case(regime, dtype="bf16" if regime in ("outlier", "tiny_scales") else "fp16")
    d = case.variant.descales
    assert torch.equal(d[0], torch.ones_like(d[0])) and bool((d == d[:, :1, :1]).all())
    verdict = check(NAME, case, device="cpu")
    assert verdict.status == "PASS" and verdict.max_ratio < 1, str(verdict)


def test_an_all_zero_tensor_has_scale_zero_and_saturating_codes_reach_the_formats_largest():
    base = _case("amax")
    zero = AttentionCase.create(base.q, torch.zeros_like(base.k), base.v, scale=base.scale, causal=base.causal,
                                variant=base.variant.replace(descales=base.variant.descales * torch.tensor(
                                    [1.0, 0.0, 1.0]).view(3, 1, 1)))
    assert check(NAME, zero, device="cpu").status == "PASS"
    with pytest.raises(InvalidArgument, match="not negative"):
        base.variant.replace(descales=-base.variant.descales)
    top = _case("saturating", scheme="per_tensor_kv_e5m2")
    assert float(top.k.float().abs().max()) == 57344.0
    assert check("torch:fp8-kv-tensor[codes=e5m2]", top, device="cpu").status == "PASS"


def test_the_descale_property_moves_a_power_of_two_between_codes_and_tensor_scales():
    case = _case("amax")
    what, moved = rescaled_case(case)
    assert "q" not in what.split(" ")[0] and "k_scale" not in what  # q has no scale to take it
    assert torch.equal(moved.q, case.q) and torch.equal(moved.variant.descales[0], case.variant.descales[0])
    for before, after in zip(case.variant.dequantized(case.q, case.k, case.v),
                             moved.variant.dequantized(moved.q, moved.k, moved.v)):
        assert torch.equal(before, after)  # the values are unchanged


@pytest.mark.parametrize("bug", [b.name for b in FP8_KV_TENSOR])
def test_each_planted_bug_is_caught_within_40_cases(bug):
    kernel = resolve_kernel(f"{NAME}~{bug}", device="cpu")
    assert first_catching_case(kernel, max_n=64) is not None, f"{kernel.name} passed 40 cases"


def test_e5m2_codes_read_as_e4m3_are_caught():
    kernel = resolve_kernel(f"{NAME}~codes_read_as_other_fp8[codes=e5m2]", device="cpu")
    assert kernel.spec.quantization is E5M2 and first_catching_case(kernel, max_n=64) is not None
    with pytest.raises(InvalidArgument, match="codes"):
        resolve_kernel(f"{NAME}[codes=e3m4]", device="cpu")
