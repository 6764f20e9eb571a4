"""The backward oracle: float64 dQ, dK, dV within their certified bounds of mpmath's, on every element.

Cases are the forward audit's (regime, mask, causal mode, scale, GQA, Nq != Nk), each with an upstream
gradient from one of the dO regimes, drawn by hypothesis so that a failure shrinks. mpmath computes
the whole case, so shapes stay small.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import event, given
from hypothesis import strategies as st

from flashcheck.numerics import blockwise

from flashcheck.numerics import gradients
from flashcheck.errors import InvalidArgument
from flashcheck.numerics.gradients import GRADIENTS, audit_gradients, group_share_max, reference_gradients
from flashcheck.numerics.oracle import reference_attention
from flashcheck.inputs.regimes import UPSTREAM_REGIMES, make_upstream

from .test_oracle_audit import AUDIT_SETTINGS, build, recipes

GRADIENT_SETTINGS = AUDIT_SETTINGS.__class__(AUDIT_SETTINGS, max_examples=200)


def _upstream(q, k, v, kwargs, regime: str, seed: int):
    out = reference_attention(q, k, v, **kwargs).out
    return make_upstream(regime, out=out, dtype=q.dtype, seed=seed)


def assert_gradient_bounds_hold(q, k, v, do, kwargs):
    audit = audit_gradients(q, k, v, do, **kwargs)
    for name in GRADIENTS:
        assert audit.worst_ratio[name] <= 1.0, (
            f"{name} bound broken: err/bound={audit.worst_ratio[name]} at {audit.worst_index[name]}")
    return audit


@GRADIENT_SETTINGS
@given(recipe=recipes(max_n=16, dims=(1, 3, 8, 16, 24)), upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))
def test_float64_gradient_bounds_hold_against_mpmath(recipe, upstream):
    q, k, v, kwargs = build(recipe)
    event(f"values={recipe['values']}")
    event(f"dO={upstream}")
    do = _upstream(q, k, v, kwargs, upstream, recipe["seed"])
    assert_gradient_bounds_hold(q, k, v, do, kwargs)


def _small(dtype=torch.float16, *, hq=4, hkv=2, nq=7, nk=9, d=8, seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(2, hq, nq, d, generator=gen) * spread).to(dtype)
    k = (torch.randn(2, hkv, nk, d, generator=gen) * spread).to(dtype)
    v = torch.randn(2, hkv, nk, d, generator=gen).to(dtype)
    do = torch.randn(2, hq, nq, d, generator=gen).to(dtype)
    return q, k, v, do


def test_gradients_match_float64_autograd_with_gqa_summed_over_the_group():
    q, k, v, do = _small()
    g = reference_gradients(q, k, v, do, scale=0.3, causal="bottom_right")
    qq, kk, vv = (t.double().requires_grad_() for t in (q, k, v))
    mask = torch.ones(7, 9, dtype=torch.bool).tril(diagonal=2)  # bottom_right: j <= i + Nk - Nq
    s = (qq @ kk.repeat_interleave(2, 1).transpose(-1, -2) * 0.3).masked_fill(~mask, -math.inf)
    out = torch.softmax(s, -1) @ vv.repeat_interleave(2, 1)
    want = torch.autograd.grad(out, (qq, kk, vv), do.double())
    for name, w in zip(GRADIENTS, want):
        err = (g[name] - w).abs()
        # autograd's float64 rounding is of the oracle's size: a few times its bound at most.
        assert bool((err <= 4 * g.bound[name] + 1e-300).all()), f"{name}: {float(err.max())}"


def test_group_shares_are_each_query_heads_gradients_and_their_running_sums():
    q, k, v, do = _small(hq=4, hkv=2, seed=3)
    kw = dict(scale=0.3, causal="none")
    assert group_share_max(q[:, :2], k, v, do[:, :2], **kw) == 0.0  # no GQA: a share is the gradient itself
    # Each query head alone (its own K/V head, no group) gives its share; the group's running sum ends at dK.
    per_head = [reference_gradients(q[:, h:h + 1], k[:, h // 2:h // 2 + 1], v[:, h // 2:h // 2 + 1],
                                    do[:, h:h + 1], **kw) for h in range(4)]
    shares = [float(g[n].abs().max()) for g in per_head for n in ("dk", "dv")]
    sums = [float((per_head[2 * j][n] + per_head[2 * j + 1][n]).abs().max()) for j in range(2) for n in ("dk", "dv")]
    assert group_share_max(q, k, v, do, **kw) == pytest.approx(max(shares + sums), rel=1e-12)


def test_rows_with_no_visible_key_get_zero_gradients_and_give_nothing_to_dk_dv():
    q, k, v, do = _small(hq=2, hkv=2)
    mask = torch.ones(2, 2, 7, 9, dtype=torch.bool)
    mask[:, :, 3] = False  # row 3 sees no key
    g = reference_gradients(q, k, v, do, scale=0.3, attn_mask=mask)
    assert bool((g.dq[:, :, 3] == 0).all()) and float(g.bound["dq"][:, :, 3].max()) < 1e-300  # underflow floor only
    do_without = do.clone()
    do_without[:, :, 3] = 0
    g2 = reference_gradients(q, k, v, do_without, scale=0.3, attn_mask=mask)
    assert torch.equal(g.dk, g2.dk) and torch.equal(g.dv, g2.dv)


def test_one_visible_key_cancels_ds_exactly_and_the_bound_carries_only_rounding():
    # With one key, dS = P (dP - D) = 0 in exact arithmetic: dQ and dK are 0, and any rule relative to
    # |dQ| would see pure noise. The oracle's dq must sit within its (tiny) bound of 0.
    q, k, v, do = _small(nk=1, hq=2, hkv=2)
    g = reference_gradients(q, k, v, do, scale=0.3)
    for name in ("dq", "dk"):
        assert bool((g[name].abs() <= g.bound[name]).all())
        assert float(g.bound[name].max()) < 1e-12
    assert_gradient_bounds_hold(q, k, v, do, dict(scale=0.3))


@pytest.mark.parametrize("regime", ["aligned", "huge", "sparse"])
def test_the_bound_stays_tight_against_the_gradients_natural_scale(regime):
    # A certified bound that grew loose would pass every kernel: keep it near float64's own size.
    q, k, v, _ = _small(seed=4)
    kw = dict(scale=0.3, causal="top_left")
    do = _upstream(q, k, v, kw, regime, 4)
    g = reference_gradients(q, k, v, do, **kw)
    for name in GRADIENTS:
        live = g.scale[name] > 0
        rel = (g.bound[name][live] / g.scale[name][live]).max()
        assert float(rel) < 1e-12, f"{name}: bound / scale {float(rel)}"


def test_huge_logits_take_the_exact_per_key_path_and_the_bounds_still_hold():
    q, k, v, do = _small(torch.float32, seed=2, spread=1e5)  # logits near 1e11: eta near 1e-5
    kw = dict(scale=1.0)
    assert reference_gradients(q, k, v, do, **kw).forward.lse_bound.max() > 2.0**-20  # the large-eta path
    assert_gradient_bounds_hold(q, k, v, do, kw)


@pytest.mark.parametrize("ops", ["numpy", "torch"])
def test_blocks_of_one_row_of_one_head_give_the_same_gradients(monkeypatch, ops):
    if ops == "torch":
        monkeypatch.setenv("FLASHCHECK_TORCH_OPS", "1")
    q, k, v, do = _small(seed=5)
    mask = torch.rand(2, 4, 7, 9, generator=torch.Generator().manual_seed(1)) > 0.3
    kw = dict(scale=0.4, causal="bottom_right", attn_mask=mask)
    whole = reference_gradients(q, k, v, do, **kw)
    monkeypatch.setattr(blockwise, "CPU_BLOCK_ELEMENTS", 1)
    cut = reference_gradients(q, k, v, do, **kw)
    for name in GRADIENTS:
        assert torch.allclose(whole[name], cut[name], rtol=0, atol=float(whole.bound[name].max()) * 2)
        assert torch.allclose(whole.bound[name], cut.bound[name], rtol=1e-12, atol=1e-300)


def test_the_audit_fails_when_a_gradient_leaves_its_bound(monkeypatch):
    q, k, v, do = _small(seed=6)
    real = gradients.float64_gradients

    def off_by_a_little(*args, **kwargs):
        g = real(*args, **kwargs)
        g.dk = g.dk + 4 * g.bound["dk"].amax()  # off by four times the bound: what a wrong term would do
        return g

    monkeypatch.setattr(gradients, "float64_gradients", off_by_a_little)
    audit = audit_gradients(q, k, v, do, scale=0.3)
    assert not audit.ok and audit.worst_ratio["dk"] > 1 and audit.worst_ratio["dq"] <= 1


@pytest.mark.parametrize("do, message", [
    (torch.zeros(2, 4, 7, 5, dtype=torch.float16), "expected a tensor of shape (2, 4, 7, 8)"),
    (torch.zeros(2, 4, 7, 8, dtype=torch.float32), "expected torch.float16 on cpu, like q"),
    (torch.full((2, 4, 7, 8), math.inf, dtype=torch.float16), "contains NaN or infinity"),
])
def test_a_bad_upstream_gradient_is_named_with_its_value_and_the_fix(do, message):
    q, k, v, _ = _small()
    with pytest.raises(InvalidArgument, match=r"do") as info:
        reference_gradients(q, k, v, do, scale=0.3)
    assert message in str(info.value)


def test_upstream_regimes_are_exact_in_the_dtype_and_do_what_they_say():
    q, k, v, _ = _small()
    out = reference_attention(q, k, v, scale=0.3).out
    zero_rows = make_upstream("zero_rows", out=out, dtype="fp16", seed=1)
    assert zero_rows.dtype == torch.float16 and bool((zero_rows == 0).all(-1).any())
    aligned = make_upstream("aligned", out=out, dtype="fp16", seed=1).double()
    cos = (aligned * out).sum(-1) / (aligned.norm(dim=-1) * out.norm(dim=-1))
    assert float(cos.min()) > 0.99
    huge = make_upstream("huge", out=out, dtype="fp16", seed=1)
    assert bool(torch.isfinite(huge).all()) and float(huge.abs().max()) > 256
    assert np.isclose(float((make_upstream("sparse", out=out, dtype="fp16", seed=1) != 0).double().mean()), 0.05, atol=0.05)
    with pytest.raises(InvalidArgument, match="Use one of"):
        make_upstream("nosuch", out=out, dtype="fp16", seed=1)
