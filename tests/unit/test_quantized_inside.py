"""A kernel that quantizes inside (SageAttention's ``sage_int8`` scheme): the scheme's record and its checks, the
oracle on the emulated quantizer's values audited by mpmath, the budget's terms for P in fp16 and P @ V summed in
fp16, the slack only where compiled code divides approximately, and a kernel that writes into its inputs reported
as such."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, Variant
from flashcheck.campaign.causes import root_cause
from flashcheck.contract.formats import FORMATS
from flashcheck.contract.quantization import SCHEMES, Scheme
from flashcheck.errors import InvalidArgument
from flashcheck.numerics.budget import contract_terms, error_budget
from flashcheck.numerics.oracle import reference_attention
from flashcheck.numerics.quantized_inside import inside_values

SAGE = SCHEMES["sage_int8"]


def _inputs(n=70, d=64, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, n, d, generator=gen).to(dtype)
    k = (torch.randn(1, 2, n, d, generator=gen) + 3.0).to(dtype)  # a large mean: smoothing matters
    v = torch.randn(1, 2, n, d, generator=gen).to(dtype)
    return q, k, v


@pytest.mark.parametrize(("fields", "argument"), [({"quantizer": "int4"}, "quantizer"), ({"p_format": "fp8"}, "p_format"),
                                                  ({"pv_sums": ("fp16", 0)}, "pv_sums"), ({"pv_sums": "fp16"}, "pv_sums")])
def test_a_scheme_names_a_known_quantizer_and_formats(fields, argument):
    with pytest.raises(InvalidArgument) as info:
        Scheme("mine", **fields)
    assert info.value.argument == argument


def test_the_budget_has_p_in_fp16_and_p_v_summed_in_fp16_over_tiles_and_exact_operands():
    terms = contract_terms("flash", torch.float32, SAGE)
    fp16 = FORMATS["fp16"]
    assert terms.u_p == fp16.unit_roundoff and terms.u_in == terms.u_v == 0.0
    assert (terms.u_pv, terms.pv_keys, terms.s_pv) == (fp16.unit_roundoff, 64, fp16.subnormal_spacing / 2)
    assert terms.u_o == FORMATS["fp32"].unit_roundoff  # the output in the input dtype
    assert contract_terms("flash", torch.float32, None).u_pv == 0.0


def test_the_oracle_attends_the_quantizers_values_and_mpmath_agrees_within_its_bound():
    q, k, v = _inputs(n=20)
    variant = Variant(quantization="sage_int8")
    fast = reference_attention(q, k, v, scale=0.125, variant=variant)
    exact = reference_attention(q, k, v, scale=0.125, variant=variant, method="mpmath")
    assert bool(((fast.out - exact.out).abs() <= fast.bound + 1e-300).all())
    plain = reference_attention(q, k, v, scale=0.125)
    assert not torch.equal(fast.out, plain.out)  # the int8 values, not the inputs


def test_the_values_are_codes_times_scales_divided_by_the_folded_multiplier_and_no_slack_on_the_cpu():
    q, k, v = _inputs()
    inside = inside_values(SAGE, q, k, v, scale=0.125)
    assert inside.slack is None and inside.q.dtype == torch.float64
    # within one code of the inputs (q's code steps are amax / 127 of each 128-token block)
    step = q.double().abs().amax(dim=(2, 3), keepdim=True) / 127
    assert bool(((inside.q - q.double()).abs() <= step * 0.5 * (1 + 1e-6)).all())
    assert torch.equal(inside.v, v.to(torch.float16).double())


def test_the_budget_is_built_on_the_quantized_problem_with_p_v_sums_in_fp16():
    q, k, v = _inputs()
    inside = Variant(quantization="sage_int8")
    budget = error_budget(q, k, v, scale=0.125, variant=inside)
    assert torch.equal(budget.reference.out, reference_attention(q, k, v, scale=0.125, variant=inside).out)
    plain = error_budget(q, k, v, scale=0.125)
    # fp16 partial sums of up to 64 products: about 64 x 2^-11 of sum p |v| / l, far above the fp32 accumulators'
    assert float((budget.terms["accumulation"] / plain.terms["accumulation"]).min()) > 10


def _writes_k(q, k, v, *, scale, causal="none", attn_mask=None):
    k -= k.mean(dim=2, keepdim=True)  # SageAttention's smoothing, in place
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale)


def test_a_kernel_that_writes_into_its_input_is_a_bug_and_named_by_it():
    q, k, v = _inputs(n=16, dtype=torch.float32)
    case = AttentionCase.create(q, k, v, scale=0.125)
    verdict = flashcheck.check(_writes_k, case, device="cpu", properties=())
    written = [f for f in verdict.findings if f.kind == "input_written"]
    assert verdict.status == "BUG" and len(written) == 1 and "input k" in written[0].diagnosis, str(verdict)
    assert not any(f.kind == "over_budget" for f in verdict.findings)  # softmax is invariant to the shift
    assert root_cause(verdict).key == "input_written:k"
    assert torch.equal(case.k, k)  # the case kept its inputs: the kernel was handed copies
    clean = flashcheck.check(lambda q, k, v, *, scale, causal="none", attn_mask=None:
                             torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale),
                             case, device="cpu", properties=())
    assert clean.status == "PASS" and math.isfinite(clean.max_ratio), str(clean)


@pytest.mark.parametrize("scale", [0.125, -0.125])
def test_the_slack_of_approximate_division_is_one_code_in_magnitude_whatever_the_scales_sign(scale):
    # A negative scale folds a negative multiplier into q: a slack of its sign once took from the logits' error
    # (found on an H100: SageAttention's cases over budget that its own codes explained).
    q, k, v = _inputs(n=128, dtype=torch.bfloat16, seed=3)
    inside = inside_values(SAGE, q, k, v, scale=scale, approximate=True)
    one_q, one_k = inside.slack
    assert bool((one_q >= 0).all() and (one_k >= 0).all()) and bool((one_q > 0).any())
    assert inside_values(SAGE, q, k, v, scale=scale).slack is None  # the CPU: the interpreter divides exactly


def test_the_k_mean_regime_gives_k_a_mean_far_above_its_spread_and_the_reference_holds_there():
    from flashcheck.inputs.quantization import INSIDE_REGIMES, inside_regime, regime_text, with_k_mean

    assert {inside_regime(seed) for seed in range(20)} == set(INSIDE_REGIMES)
    seed = next(s for s in range(20) if inside_regime(s) == "k_mean")
    assert regime_text(seed, "sage_int8") == "/sage_int8=k_mean" and "sage" not in regime_text(seed, "per_head")
    q, k, v = _inputs(n=70, seed=5)
    shifted = with_k_mean(k, seed)
    spread = (shifted.double() - shifted.double().mean(2, keepdim=True)).abs().amax()
    assert shifted.dtype == k.dtype and bool(torch.isfinite(shifted).all())
    assert float(shifted.double().mean(2).abs().amax()) > 4 * float(spread)
    case = AttentionCase.create(q, shifted, v, scale=0.125)
    assert flashcheck.check("torch:int8-qk", case, device="cpu").status == "PASS"
