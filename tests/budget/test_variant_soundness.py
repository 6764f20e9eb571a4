"""The budget stays sound on the attention variants: legal kernels (the precision-faithful twin at several
tilings and key orders, its tanh correctly rounded or built from exp) stay inside it on soft-capped logits,
ALiBi (both modes) and float biases (before and after the cap), windows, chunks and sinks, and the float64
oracle's own bounds, forward and backward (dBias and dSinks included), hold against mpmath on them (tanh and
its slope included)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flashcheck import Variant
from flashcheck.contract.formats import FORMATS
from flashcheck.contract.precision import PRESETS
from flashcheck.contract.spec import KernelSpec
from flashcheck.inputs.regimes import UPSTREAM_REGIMES, make_upstream
from flashcheck.inputs.recipe_draws import recipes
from flashcheck.judge.backward import compare_gradients
from flashcheck.judge.comparison import compare
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.gradient_budget import gradient_budget
from flashcheck.numerics.gradients import audit_gradients
from flashcheck.numerics.oracle import reference_attention
from flashcheck.numerics.twin import Habits, Tiling, twin_attention

VARIANTS = KernelSpec(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
                      min_head_dim=1, max_head_dim=96, softcap=True, window=True, chunk=True, sinks=True,
                      alibi="symmetric", attn_bias=True, fp32_bias=True)
# The other ALiBi mode and the other order of cap and bias.
OTHER_ORDER = VARIANTS.replace(alibi="linear", bias_order="bias_first")
SWEEP = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@SWEEP
@given(recipe=st.one_of(recipes(spec=VARIANTS, max_n=80, max_heads=2, layouts=["contiguous"]),
                        recipes(spec=OTHER_ORDER, max_n=80, max_heads=2, layouts=["contiguous"])),
       tiles=st.sampled_from([(16, 16), (32, 64), (64, 32)]), precision=st.sampled_from(sorted(PRESETS)),
       shuffle=st.booleans(), tanh_from_exp=st.booleans())
def test_legal_reorderings_of_variants_stay_inside_the_budget(recipe, tiles, precision, shuffle, tanh_from_exp):
    case = recipe.build()
    order = torch.randperm(case.shapes.n_k, generator=torch.Generator().manual_seed(recipe.seed)) if shuffle else None
    out, lse = twin_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal, attn_mask=case.attn_mask,
                              precision=precision, variant=case.variant, tiling=Tiling(*tiles, key_order=order),
                              habits=Habits(tanh_from_exp=tanh_from_exp))
    budget = error_budget(case.q, case.k, case.v, scale=case.scale, causal=case.causal, attn_mask=case.attn_mask,
                          precision=precision, variant=case.variant)
    findings, _ = compare(out, lse, budget, fully_masked_rows="zero")
    event(" ".join(f"{f}={r}" for f, r in recipe.variants.items()) or "plain")
    assert not findings, "\n".join(f.summary() for f in findings) + f"\n{case.describe()}"


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(recipe=st.one_of(*(recipes(spec=spec.replace(max_head_dim=16), max_n=12, max_heads=2, max_batch=1,
                                 layouts=["contiguous"]) for spec in (VARIANTS, OTHER_ORDER))))
def test_the_oracle_bound_holds_against_mpmath_on_variants(recipe):
    case = recipe.build()
    audit = audit_reference(case.q, case.k, case.v, scale=case.scale, causal=case.causal, attn_mask=case.attn_mask,
                            variant=case.variant, dps=40)
    assert audit.ok, (audit, case.describe())


@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(recipe=st.one_of(*(recipes(spec=spec.replace(max_head_dim=16), max_n=10, max_heads=2, max_batch=1,
                                 layouts=["contiguous"]) for spec in (VARIANTS, OTHER_ORDER))),
       upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))
def test_the_gradient_oracle_bound_holds_against_mpmath_on_variants(recipe, upstream):
    case = recipe.build()
    kw = dict(scale=case.scale, causal=case.causal, attn_mask=case.attn_mask, variant=case.variant)
    do = make_upstream(upstream, out=reference_attention(case.q, case.k, case.v, **kw).out, dtype=case.torch_dtype,
                       seed=recipe.seed)
    audit = audit_gradients(case.q, case.k, case.v, do, dps=40, **kw)
    assert audit.ok, (audit, case.describe())


def test_a_gradient_whose_fp32_products_all_flush_to_zero_is_within_the_budget():
    # Measured on an H200: a sink far above the logits leaves P near e^-50 and dO aligned with O near
    # 1e-22, so every product P dO of dV is an fp32 subnormal, which tensor cores flush to zero.
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen) for n in (64, 8, 8))
    variant = Variant(sinks=torch.tensor([50.0]))
    out = reference_attention(q, k, v, scale=0.25, variant=variant).out
    do = make_upstream("aligned", out=out, dtype=torch.float32, seed=0)
    budget = gradient_budget(q, k, v, do, scale=0.25, precision="flash", variant=variant)
    exact = budget.gradients
    assert 0 < float(exact.dv.abs().max()) < FORMATS["fp32"].smallest_normal
    flushed = (exact.dq.float(), exact.dk.float(), torch.zeros_like(exact.dv, dtype=torch.float32))
    findings, _ = compare_gradients(flushed, budget)
    assert not findings, [f.summary() for f in findings]


def test_a_forward_output_whose_fp32_weights_and_products_flush_to_zero_is_within_the_budget():
    # A sink of 50 over keys a bias of -40 holds near -40: each weight is near e^-90, under fp32's smallest
    # normal, which a GPU's exp (ex2.approx.ftz) and its tensor cores' products flush to 0. V's rows come in
    # opposite pairs, so that no other term of the budget (each measured from V's mean, 0) covers the loss.
    gen = torch.Generator().manual_seed(0)
    q, k, half = (torch.randn(1, 1, n, 16, generator=gen) for n in (8, 64, 32))
    v = torch.cat((half, -half), dim=2)
    variant = Variant(attn_bias=torch.full((1, 1, 1, 64), -40.0), sinks=torch.tensor([50.0]))
    budget = error_budget(q, k, v, scale=0.01, precision="flash", variant=variant)
    exact = budget.reference.out
    assert 0 < float(exact.abs().max()) < FORMATS["fp32"].smallest_normal
    findings, _ = compare(torch.zeros_like(q), None, budget, fully_masked_rows="zero")
    assert not findings, [f.summary() for f in findings]
