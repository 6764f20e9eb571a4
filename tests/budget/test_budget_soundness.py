"""The error budget never cries wolf: legal kernels stay inside it on every regime.

The legal kernels are the precision-faithful twin (the tiled algorithm with the contract's roundings)
at several tile shapes and key orders, with round-to-nearest and truncating tf32. A random sweep over
every value and mask regime, kept in the suite so the budget stays sound as it is tightened.
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flashcheck.contract.precision import PRESETS
from flashcheck.contract.spec import KernelSpec
from flashcheck.inputs.recipe_draws import recipes
from flashcheck.judge.comparison import compare
from flashcheck.numerics.budget import contract_terms, error_budget
from flashcheck.numerics.twin import Habits, Tiling, twin_attention

ALL = KernelSpec(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
                 min_head_dim=1, max_head_dim=96)
SWEEP = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))


@SWEEP
@given(recipe=recipes(spec=ALL, max_n=80, max_heads=2, layouts=["contiguous"]),
       tiles=st.sampled_from([(16, 16), (32, 64), (64, 32), (64, 128)]),
       precision=st.sampled_from(sorted(PRESETS)),
       shuffle=st.booleans(), tf32_mode=st.sampled_from(["nearest", "truncate"]),
       scale_inputs=st.booleans(), softmax_first=st.booleans())
def test_legal_reorderings_stay_inside_the_budget(recipe, tiles, precision, shuffle, tf32_mode, scale_inputs,
                                                  softmax_first):
    case = recipe.build()
    contract = PRESETS[precision]
    # The orders of operations this contract allows (a one-pass contract: where scale and softmax apply).
    scale_inputs &= contract.scale_on_inputs
    softmax_first &= not contract.rescales_per_tile
    order = torch.randperm(case.shapes.n_k, generator=torch.Generator().manual_seed(recipe.seed)) if shuffle else None
    out, lse = twin_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                              attn_mask=case.attn_mask, precision=precision, tiling=Tiling(*tiles, key_order=order),
                              habits=Habits(tf32_mode=tf32_mode, scale_inputs=scale_inputs,
                                            softmax_first=softmax_first))
    budget = error_budget(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                          attn_mask=case.attn_mask, precision=precision)
    findings, ratio = compare(out, lse, budget, fully_masked_rows="zero")
    event(f"{recipe.dtype} {recipe.values}")
    assert not findings, "\n".join(f.summary() for f in findings) + f"\n{case.describe()}"


def test_contract_terms():
    flash32, strict32 = contract_terms("flash", "fp32"), contract_terms("strict", "fp32")
    assert flash32.u_v == flash32.u_in == flash32.u_p == 2.0**-10  # tf32 may truncate
    assert strict32.u_v == strict32.u_in == 0 and strict32.u_p == 2.0**-24
    assert contract_terms("flash", "fp16").u_p == 2.0**-11 and contract_terms("flash", "bf16").u_p == 2.0**-8
    assert contract_terms("upcast", "bf16").u_p == 0 and contract_terms("upcast", "bf16").u_o == 2.0**-8
    assert contract_terms("flash", "fp16").s_o == 2.0**-25
