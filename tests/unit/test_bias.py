"""ALiBi and attn_bias through the oracle, the budget, the backward judge (dBias, dSinks) and the bias-shift
property: the oracle agrees with a direct float64 computation in both orders of cap and bias, a kernel
computing the same passes, and kernels wrong in one place are found where they are wrong."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, Variant
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.gradients import audit_gradients, reference_gradients
from flashcheck.numerics.oracle import reference_attention

B, HQ, HKV, NQ, NK, D = 2, 4, 2, 5, 7, 8


def _qkv(dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, NQ, D, generator=gen).to(dtype)
    k, v = (torch.randn(B, HKV, NK, D, generator=gen).to(dtype) for _ in range(2))
    return q, k, v


def _bias(dtype=torch.float16, seed=1):
    bias = 3 * torch.randn(1, HQ, NQ, NK, generator=torch.Generator().manual_seed(seed))
    bias[0, 1, 2, :] = -math.inf  # a row the bias hides entirely
    bias[0, 0, 1, 3] = -math.inf
    return bias.to(dtype)


def _variant(order="cap_first", cap=5.0, alibi="symmetric", sinks=True, dtype=torch.float16):
    return Variant(softcap=cap, alibi_slopes=torch.rand(B, HQ, generator=torch.Generator().manual_seed(2)),
                   attn_bias=_bias(dtype), bias_order=order, alibi=alibi,
                   sinks=torch.randn(HQ, generator=torch.Generator().manual_seed(3)) if sinks else None)


def _direct(q, k, v, scale, variant, *, grad=False):
    """softmax(cap and bias in the variant's order, sinks in the sum) @ V in float64, with autograd."""
    n_q, n_k, group = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    qd, kd, vd = (t.double().requires_grad_(grad) for t in (q, k, v))
    bias = variant.attn_bias.double().requires_grad_(grad)
    sinks = variant.sinks.double().requires_grad_(grad)
    s = qd @ kd.repeat_interleave(group, 1).transpose(-1, -2) * scale
    alibi = Variant(alibi_slopes=variant.alibi_slopes, alibi=variant.alibi).bias(n_q, n_k, torch.arange(n_q), "cpu")
    b = alibi + bias.masked_fill(bias == -math.inf, 0.0)
    cap = variant.softcap
    if cap is None:
        s = s + b
    elif variant.bias_order == "bias_first":
        s = cap * torch.tanh((s + b) / cap)
    else:
        s = cap * torch.tanh(s / cap) + b
    s = s.masked_fill(bias == -math.inf, -math.inf)
    full = torch.cat([s, sinks.view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    out = torch.softmax(full, -1)[..., :-1] @ vd.repeat_interleave(group, 1)
    return out, torch.logsumexp(full, -1), (qd, kd, vd, bias, sinks)


@pytest.mark.parametrize("order", ["cap_first", "bias_first"])
@pytest.mark.parametrize("cap", [None, 5.0])
@pytest.mark.parametrize("alibi", ["symmetric", "linear"])
def test_the_oracle_is_the_direct_computation_in_either_order(order, cap, alibi):
    q, k, v = _qkv()
    variant = _variant(order, cap, alibi)
    ref = reference_attention(q, k, v, scale=0.3, variant=variant)
    out, lse, _ = _direct(q, k, v, 0.3, variant)
    assert float((ref.out - out).abs().max()) <= float(ref.bound.max())
    assert float((ref.lse - lse).abs().max()) <= float(ref.lse_bound.max())


@pytest.mark.parametrize("order", ["cap_first", "bias_first"])
def test_the_bounds_hold_against_mpmath_forward_and_backward_with_every_gradient(order):
    q, k, v = _qkv()
    variant = _variant(order)
    assert audit_reference(q, k, v, scale=0.3, variant=variant, rows=[0, 2, 4], dps=40).ok
    do = torch.randn(B, HQ, NQ, D, generator=torch.Generator().manual_seed(4)).half()
    audit = audit_gradients(q, k, v, do, scale=0.3, variant=variant, dps=40)
    assert set(audit.worst_ratio) == {"dq", "dk", "dv", "dbias", "dsinks"} and audit.ok, audit


def test_dbias_and_dsinks_are_the_autograd_gradients_of_the_direct_computation():
    q, k, v = _qkv()
    variant = _variant("bias_first")
    do = torch.randn(B, HQ, NQ, D, generator=torch.Generator().manual_seed(4)).half()
    grads = reference_gradients(q, k, v, do, scale=0.3, variant=variant)
    out, _, leaves = _direct(q, k, v, 0.3, variant, grad=True)
    want = torch.autograd.grad(out, leaves, do.double())
    for name, w in zip(("dq", "dk", "dv", "dbias", "dsinks"), want):
        assert torch.all((grads[name] - w.nan_to_num(0.0)).abs() <= grads.bound[name]), name


# -- kernels: one correct, then one wrong place each -------------------------------------------------

def _kernel(q, k, v, *, scale, causal, attn_mask=None, softcap=None, alibi_slopes=None, attn_bias=None,
            sinks=None, mistake=None):
    alibi = Variant(alibi_slopes=alibi_slopes)  # (Variant holds copies: the bias and sinks stay leaves)
    n_q, n_k = q.shape[2], k.shape[2]
    alibi = None if alibi_slopes is None else alibi.bias(n_q, n_k, torch.arange(n_q), "cpu")
    if mistake == "alibi_off_by_one":  # -slope (|i' - j| + 1)
        alibi = alibi - alibi_slopes.double().view(1, -1, 1, 1)
    if mistake == "bias_scaled":
        attn_bias = attn_bias * scale
    if attn_bias is None:
        attn_bias = torch.zeros(1, dtype=q.dtype)
    if sinks is None:
        sinks = torch.full((q.shape[1],), -math.inf)
    if mistake == "row_constant_bias_dropped" and attn_bias.shape[-1] == 1:
        attn_bias = torch.zeros_like(attn_bias)
    attn_bias = _NegatedGradient.apply(attn_bias) if mistake == "dbias_negated" else attn_bias
    sinks = _NegatedGradient.apply(sinks) if mistake == "dsinks_negated" else sinks
    out, lse = _direct_autograd(q, k, v, scale, softcap, alibi, attn_bias, sinks)
    return out.to(q.dtype), lse.float()


def _direct_autograd(q, k, v, scale, softcap, alibi, bias, sinks):
    """The direct computation on the caller's leaves (so that autograd reaches q, k, v, bias, sinks)."""
    group = q.shape[1] // k.shape[1]
    s = q.double() @ k.double().repeat_interleave(group, 1).transpose(-1, -2) * scale
    bias = bias.double()
    s = softcap * torch.tanh(s / softcap) if softcap not in (None, math.inf) else s  # the cap first
    s = s if alibi is None else s + alibi
    s = s + bias.masked_fill(bias == -math.inf, 0.0)
    s = s.masked_fill(bias == -math.inf, -math.inf)
    full = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
    return torch.softmax(full, -1)[..., :-1] @ v.double().repeat_interleave(group, 1), torch.logsumexp(full, -1)


class _NegatedGradient(torch.autograd.Function):
    """The identity, whose gradient comes back negated (a sign error in dBias or dSinks)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return -grad


def _spec_kernel(mistake=None):
    def fn(q, k, v, **kw):
        return _kernel(q, k, v, mistake=mistake, **kw)
    return flashcheck.kernel(fn, name=f"bias:{mistake}", softcap=True, alibi="symmetric", attn_bias=True,
                             sinks=True, gqa=True, backward=True, precision="upcast")


def _case(**changes):
    q, k, v = _qkv()
    fields = dict(softcap=5.0, alibi_slopes=torch.rand(HQ, generator=torch.Generator().manual_seed(2)),
                  attn_bias=_bias(), sinks=torch.randn(HQ, generator=torch.Generator().manual_seed(3)))
    fields.update(changes)
    return AttentionCase.create(q, k, v, scale=0.3, variant=Variant(**fields))


def test_a_correct_kernel_with_cap_alibi_bias_and_sinks_passes_forward_and_backward():
    case = _case()
    assert flashcheck.check(_spec_kernel(), case, device="cpu").status == "PASS"
    verdict = flashcheck.check_backward(_spec_kernel(), case, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert {"dbias", "dsinks"} <= set(verdict.ratios), verdict.ratios


@pytest.mark.parametrize("mistake, named", [("alibi_off_by_one", "ALiBi one key off (distance + 1)"),
                                            ("bias_scaled", "attn_bias multiplied by the softmax scale")])
def test_a_kernel_wrong_in_its_bias_is_a_bug_and_the_diagnosis_names_the_mistake(mistake, named):
    verdict = flashcheck.check(_spec_kernel(mistake), _case(), device="cpu")
    assert verdict.status == "BUG" and named in verdict.findings[0].diagnosis, str(verdict)


def test_alibi_one_key_off_without_cap_or_sink_moves_only_the_lse():
    # Without a cap or a sink, one more key of distance is a constant per row: the output is exact, the lse
    # moves by the slope.
    verdict = flashcheck.check(_spec_kernel("alibi_off_by_one"), _case(softcap=None, sinks=None), device="cpu")
    assert verdict.status == "BUG" and [f.kind for f in verdict.findings] == ["lse"], str(verdict)


@pytest.mark.parametrize("mistake, gradient", [("dbias_negated", "dbias"), ("dsinks_negated", "dsinks")])
def test_a_wrong_gradient_of_the_bias_or_the_sinks_is_a_bug_of_that_gradient(mistake, gradient):
    verdict = flashcheck.check_backward(_spec_kernel(mistake), _case(), device="cpu")
    assert verdict.status == "BUG", str(verdict)
    assert {(f.details or {}).get("gradient") for f in verdict.findings} == {gradient}, str(verdict)


def test_the_bias_shift_property_finds_a_kernel_that_drops_a_row_constant_bias():
    # A bias of one value per row cannot change the output, only the lse: a kernel that skips it gets
    # every output right and the lse wrong, which only the shifted case shows.
    case = _case(softcap=None, sinks=None, attn_bias=None)
    verdict = flashcheck.check(_spec_kernel("row_constant_bias_dropped"), case, device="cpu",
                               properties=["bias_shift"])
    assert verdict.status == "BUG" and verdict.findings[0].kind == "bias_shift_dependence", str(verdict)
    assert flashcheck.check(_spec_kernel(), case, device="cpu", properties=["bias_shift"]).status == "PASS"
