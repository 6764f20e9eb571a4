"""The float64 oracle's certified bound holds against mpmath on every audited element.

Cases come from the adversarial regimes (a regime name plus a seed), drawn by hypothesis so a failure
shrinks to a small recipe. Small cases are audited whole; long rows are audited on sampled rows.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from flashcheck.contract.validation import CAUSAL_MODES, Shapes
from flashcheck.inputs.regimes import MASK_REGIMES, SCALE_REGIMES, VALUE_REGIMES, make_mask, make_scale, make_values
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.oracle import reference_attention

AUDIT_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
ROW_BUDGET = 48  # rows audited per case (B * Hq * rows): mpmath costs ~2 ms a row here


@st.composite
def recipes(draw, *, max_n=64, dims=(1, 2, 3, 8, 16, 24, 32)):
    heads_kv = draw(st.integers(1, 2))
    shapes = Shapes(
        batch=draw(st.integers(1, 2)),
        heads_q=heads_kv * draw(st.integers(1, 2)),
        heads_kv=heads_kv,
        n_q=draw(st.integers(1, max_n)),
        n_k=draw(st.integers(1, max_n)),
        head_dim=draw(st.sampled_from(dims)),
        head_dim_v=draw(st.sampled_from(dims)),
    )
    return dict(
        shapes=shapes,
        dtype=draw(st.sampled_from(("fp16", "bf16", "fp32"))),
        values=draw(st.sampled_from(sorted(VALUE_REGIMES))),
        mask=draw(st.sampled_from(sorted(MASK_REGIMES))),
        causal=draw(st.sampled_from(CAUSAL_MODES)),
        scale=draw(st.sampled_from(SCALE_REGIMES)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def build(recipe):
    s = recipe["shapes"]
    q, k, v = make_values(recipe["values"], shapes=s, dtype=recipe["dtype"], seed=recipe["seed"])
    mask = make_mask(recipe["mask"], shapes=s, seed=recipe["seed"])
    return q, k, v, dict(scale=make_scale(recipe["scale"], head_dim=s.head_dim), causal=recipe["causal"],
                         attn_mask=mask)


def sampled_rows(shapes: Shapes, seed: int):
    per_row = shapes.batch * shapes.heads_q
    if per_row * shapes.n_q <= ROW_BUDGET:
        return None
    count = max(1, ROW_BUDGET // per_row)
    gen = torch.Generator().manual_seed(seed)
    # Always include the first and last rows: causal edges and the tail tile live there.
    picks = {0, shapes.n_q - 1} | set(torch.randint(0, shapes.n_q, (count,), generator=gen).tolist())
    return sorted(picks)


def assert_bound_holds(q, k, v, kwargs, rows):
    audit = audit_reference(q, k, v, rows=rows, **kwargs)
    assert audit.empty_rows_agree, "float64 and mpmath disagree on which rows are fully masked"
    assert audit.worst_ratio <= 1.0, f"float64 bound broken: err/bound={audit.worst_ratio} at {audit.worst_index}"
    assert audit.lse_worst_ratio <= 1.0, f"lse bound broken: err/bound={audit.lse_worst_ratio}"
    return audit


@AUDIT_SETTINGS
@given(recipe=recipes())
def test_float64_bound_holds_against_mpmath(recipe):
    q, k, v, kwargs = build(recipe)
    event(f"values={recipe['values']}")
    event(f"mask={recipe['mask']}")
    ref = reference_attention(q, k, v, **kwargs)
    if bool(ref.empty_rows.any()):
        event("has fully masked rows")
    assert_bound_holds(q, k, v, kwargs, sampled_rows(recipe["shapes"], recipe["seed"]))


@settings(max_examples=12, deadline=None, derandomize=True)
@given(recipe=recipes(max_n=320, dims=(16, 64, 128)))
def test_float64_bound_holds_on_sampled_rows_of_long_cases(recipe):
    q, k, v, kwargs = build(recipe)
    assert_bound_holds(q, k, v, kwargs, sampled_rows(recipe["shapes"], recipe["seed"]))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("values", sorted(VALUE_REGIMES))
def test_every_value_regime_with_fully_masked_rows(dtype, values):
    s = Shapes(1, 2, 1, 13, 21, 8, 8)
    q, k, v = make_values(values, shapes=s, dtype=dtype, seed=7)
    mask = make_mask("fully_masked_rows", shapes=s, seed=3)
    kwargs = dict(scale=make_scale("default", head_dim=8), causal="bottom_right", attn_mask=mask)
    ref = reference_attention(q, k, v, **kwargs)
    assert bool(ref.empty_rows.any()), "the regime should leave some rows with no visible key"
    assert_bound_holds(q, k, v, kwargs, None)


def test_fully_masked_rows_are_marked_not_numbers():
    s = Shapes(1, 1, 1, 6, 3, 4, 4)  # Nq > Nk with bottom-right alignment: the first 3 rows see nothing
    q, k, v = make_values("random", shapes=s, dtype="fp16", seed=0)
    for method in ("float64", "mpmath"):
        ref = reference_attention(q, k, v, scale=0.5, causal="bottom_right", method=method)
        assert ref.empty_rows[0, 0].tolist() == [True, True, True, False, False, False]
        assert bool(torch.isnan(ref.out[0, 0, :3]).all())
        assert bool((ref.lse[0, 0, :3] == -math.inf).all())
        assert bool(torch.isfinite(ref.out[0, 0, 3:]).all())


def test_bound_is_tight_enough_to_judge_fp32():
    """The oracle's bound must sit far below the rounding of the formats it judges."""
    s = Shapes(1, 1, 1, 64, 256, 64, 64)
    q, k, v = make_values("random", shapes=s, dtype="fp32", seed=1)
    ref = reference_attention(q, k, v, scale=0.125)
    assert float((ref.bound / ref.w).max()) < 2.0**-24 / 1e4


def test_fp16_subnormal_inputs_and_cancelling_v_hold_against_mpmath():
    s = Shapes(1, 1, 1, 9, 33, 16, 16)
    q, k, v = make_values("tiny_values", shapes=s, dtype="fp16", seed=5)
    assert bool(((v != 0) & (v.abs() < 2.0**-14)).any()), "expected fp16 subnormals in v"
    assert_bound_holds(q, k, v, dict(scale=0.25, causal="none", attn_mask=None), None)
    q, k, v = make_values("cancelling_v", shapes=s, dtype="fp16", seed=5)
    assert_bound_holds(q, k, v, dict(scale=0.25, causal="none", attn_mask=None), None)
