"""The backward oracle: exact dQ, dK, dV for an upstream gradient dO, in float64 with a certified bound.

The forward oracle's walk over the scores gives each block's weights P^ = p^ / l^ and the bound E_ij
on |P^_ij - a_ij| (its per-row relative factor, or its exact per-key shift on rows with huge logits),
and the block computes, in float64 (u = 2^-53, gamma_n = n u / (1 - n u), dO in the inputs' dtype so
every product below is exact before it is summed):

    dV = P^T dO     dP = dO V^T     D_i = dO_i . O^_i     dS = P^ (dP - D)
    dQ = scale dS K                 dK = scale dS^T Q     (GQA: the group's rows summed into dK, dV)

Every error is bounded element by element, as products of non-negative matrices:

- dP carries gamma_Dv A_ij, A = |dO| |V|^T; D carries sum_k |dO_ik| bound(O^_ik) + gamma_Dv sum_k |dO_ik||O^_ik|.
- dS: P^ (dP^ - D^) - a (dP - D) = (P^ - a)(dP^ - D^) + a ((dP^ - dP) - (D^ - D)), so with a <= P^ + E,
  |dS^ - dS| <= e_ij = E_ij |dP^_ij - D^_i| + (P^_ij + E_ij)(gamma_Dv A_ij + err D_i) + 3 u |dS^_ij|.
- dQ: |scale| (e + gamma_{n+1} |dS^|) |K|, and dK: |scale| (e + gamma_{n+1} |dS^|)^T |Q| (n: the longer
  of the two sums, Nk or the G Nq rows of a K/V head, summed in any order and over any blocks).
- dV: (E + gamma_{n+1} P^)^T |dO|.
- Products that underflow (P^ and dS^ may be as small as float64 allows) round with an absolute error of
  at most 2^-1075: each sum gets n such terms, dS and D a few.

Rows with no visible key have zero gradients, exactly (no weight, no error). Every term is first order
and exact in form; a final factor (1 + 2^-16) covers the rounding of the bound's own arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..contract.counts import check_count
from ..contract.formats import FP64
from ..contract.validation import Shapes, check_attention_inputs
from ..errors import InvalidArgument
from ..features.variant import Variant
from .answers import GRADIENTS, Gradients
from .blockwise import AttentionCall, add_into, ops_for
from .exact import mpmath_gradients
from .oracle import SAFETY, UNDERFLOW, float64_reference_walk, reference_attention
from .variant_gradients import Reductions

__all__ = ["Gradients", "GradientAudit", "reference_gradients", "audit_gradients", "group_share_max", "GRADIENTS"]

U64 = FP64.unit_roundoff
METHODS = ("float64", "mpmath")
# A product that underflows rounds with an absolute error of up to half of this (the smallest subnormal):
# P^ and dS^ can be as small as float64 allows, where a relative bound says nothing.
SUBNORMAL = 2.0**-1074


def _gamma(n: int) -> float:
    return n * U64 / (1 - n * U64)


def reference_gradients(q, k, v, do, *, scale: float, causal: str = "none", attn_mask=None,
                        method: str = "float64", dps: int = 50, variant: Variant | None = None) -> Gradients:
    """dQ, dK and dV of attention for the upstream gradient ``do`` (B, Hq, Nq, Dv), exact enough to judge
    a kernel's backward, each with a bound on its own error.

    ``method="float64"`` runs in numpy on the CPU and in torch float64 on a GPU; ``method="mpmath"``
    computes the same with ``dps`` digits (an auditor for small cases). ``variant``: the case's cap (its
    slope 1 - tanh^2 carries dS back to the scaled logits), bias, visible keys and sink; the gradients of its
    tensors (:mod:`.variant_gradients`) come with dQ, dK and dV.
    """
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    do = check_upstream(do, q, shapes)
    variant = Variant() if variant is None else variant
    if method not in METHODS:
        raise InvalidArgument("method", method, "unknown oracle method", f"Use one of {list(METHODS)}.")
    check_count("dps", dps, minimum=20, maximum=10_000, what="a number of digits",
                fix="Pass dps=50 (the default) or more digits for extreme inputs.")
    if method == "mpmath":
        forward = reference_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, method="mpmath",
                                      dps=dps, variant=variant)
        return mpmath_gradients(AttentionCall(q, k, v, scale, causal, attn_mask, shapes, variant), do, forward)
    return float64_gradients(q, k, v, do, scale, causal, attn_mask, shapes, variant=variant)


def group_share_max(q, k, v, do, *, scale: float, causal: str = "none", attn_mask=None,
                    variant: Variant | None = None) -> float:
    """The largest exact |dK| or |dV| that one query head of a GQA group contributes, or that the group's
    contributions reach summed in head order (0 without GQA: each head's share is then the gradient).

    Kernels that round each head's share (or the running sum over the group) to the inputs' dtype before
    summing the group overflow there even when the summed gradient is small. Each share is the gradient of
    the same attention with K and V repeated over the query heads.
    """
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return 0.0
    grads = reference_gradients(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), do, scale=scale,
                                causal=causal, attn_mask=attn_mask, variant=variant)
    largest = 0.0
    for share in (grads.dk, grads.dv):  # (B, Hq, Nk, .) as (B, Hkv, G, Nk, .), summed along G in order
        running = share.reshape(share.shape[0], -1, group, *share.shape[2:]).cumsum(2)
        largest = max(largest, float(_largest_magnitude(share)), float(_largest_magnitude(running)))
    return largest


def check_upstream(do, q, shapes: Shapes):
    want = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v)
    if not isinstance(do, torch.Tensor) or tuple(do.shape) != want:
        raise InvalidArgument("do", getattr(do, "shape", do), f"expected a tensor of shape {want} (B, Hq, Nq, Dv)",
                              "Pass the gradient of the loss with respect to the attention output.")
    if do.dtype != q.dtype or do.device != q.device:
        raise InvalidArgument("do", f"{do.dtype} on {do.device}", f"expected {q.dtype} on {q.device}, like q",
                              "Pass dO in the inputs' dtype and on their device (a kernel's backward takes it so).")
    if not bool(torch.isfinite(do).all()):
        raise InvalidArgument("do", "non-finite values", "contains NaN or infinity",
                              "The oracle needs a finite upstream gradient.")
    return do


class _Accumulators:
    """The gradients and their bounds, filled block by block (dK, dV summed over row blocks)."""

    def __init__(self, shapes: Shapes, device):
        P, G = shapes.batch * shapes.heads_kv, shapes.group
        z = lambda *s: torch.zeros(s, dtype=torch.float64, device=device)  # noqa: E731
        self.dq = {n: z(P, G, shapes.n_q, shapes.head_dim) for n in ("value", "bound", "scale")}
        self.dk = {n: z(P, shapes.n_k, shapes.head_dim) for n in ("value", "bound", "scale")}
        self.dv = {n: z(P, shapes.n_k, shapes.head_dim_v) for n in ("value", "bound", "scale")}
        self.ds_max = []  # each block's largest |dS|, read once at the end (one host sync, not one a block)


def float64_gradients(q, k, v, do, scale, causal, attn_mask, shapes: Shapes, extra_on_block=None,
                      variant: Variant | None = None) -> Gradients:
    """The float64 gradients; ``extra_on_block(block, forward, block_gradients)`` sees each block's
    intermediates (the gradient budget uses them, in the same walk)."""
    ops = ops_for(q.device)
    P, G = shapes.batch * shapes.heads_kv, shapes.group
    dO = ops.asarray(do).reshape(P, G, shapes.n_q, shapes.head_dim_v)
    acc = _Accumulators(shapes, q.device)
    variant = Variant() if variant is None else variant
    extra = Reductions(variant, shapes, q.device, ("value", "bound", "scale", "abs"))
    # dK and dV sum the G Nq rows of their K/V head, dQ the Nk keys (and the scale multiply rounds once).
    n_sum = max(shapes.n_k, G * shapes.n_q) + 2
    g_sum, g_dot = _gamma(n_sum), _gamma(shapes.head_dim_v)
    # Every product of those sums may underflow, and the scale multiply after them.
    floor = {"dq": n_sum * (1 + abs(scale)) * SUBNORMAL, "dk": n_sum * (1 + abs(scale)) * SUBNORMAL,
             "dv": n_sum * SUBNORMAL}

    def on_block(blk, fwd):
        bg = block_gradients(ops, blk, fwd, dO[blk.heads, :, blk.sl], g_dot, scale)
        parts = _without_sink_key(blk, _gradient_block(ops, blk, bg, scale, g_sum), shapes.n_k)
        acc.ds_max.append(_largest_magnitude(bg.dS))
        _add_variant_gradients(ops, blk, bg, extra)
        if extra_on_block is not None:
            extra_on_block(blk, fwd, bg)
        for name, results in zip(GRADIENTS, parts):
            for what, value in zip(("value", "bound", "scale"), results):
                target = getattr(acc, name)[what]
                if name == "dq":
                    add_into(ops, target, (blk.heads, slice(None), blk.sl), value)
                else:
                    add_into(ops, target, (blk.heads,), value)

    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        forward = float64_reference_walk(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, rows=None,
                                         on_block=on_block, variant=variant)
    shape_q = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim)
    shape_k = (shapes.batch, shapes.heads_kv, shapes.n_k, shapes.head_dim)
    shape_v = (shapes.batch, shapes.heads_kv, shapes.n_k, shapes.head_dim_v)
    shaped = {"dq": shape_q, "dk": shape_k, "dv": shape_v}
    out = {n: {w: t.reshape(shaped[n]) for w, t in getattr(acc, n).items()} for n in GRADIENTS}
    bound = {n: (out[n]["bound"] + floor[n]) * SAFETY for n in GRADIENTS}
    sizes = {n: out[n]["scale"] for n in GRADIENTS}
    values = {}
    for n in extra.names:  # summed in float64 over what the tensor broadcasts along
        values[n] = extra.reduced(n, "value")
        g = _gamma(extra.terms(n))
        bound[n] = (extra.reduced(n, "bound") + g * extra.reduced(n, "abs") + extra.terms(n) * SUBNORMAL) * SAFETY
        sizes[n] = extra.reduced(n, "scale")
    return Gradients(dq=out["dq"]["value"], dk=out["dk"]["value"], dv=out["dv"]["value"], bound=bound, scale=sizes,
                     forward=forward, method="float64", shapes=shapes,
                     ds_max=max((float(m) for m in acc.ds_max), default=0.0), **values)


def _add_variant_gradients(ops, blk, bg, extra: Reductions) -> None:
    """One block's share of each variant gradient: dS where the bias enters, or the sink's column."""
    size = bg.weights * (ops.abs(bg.dP) + ops.abs(bg.D))
    for name in extra.names:
        dS = extra.share(blk, name, bg.dS_logit, bg.dS)
        extra.add(ops, blk, name, {"value": dS, "abs": ops.abs(dS), "scale": extra.share(blk, name, size, size),
                                   "bound": extra.share(blk, name, bg.err_dS_logit, bg.err_dS)})


def _without_sink_key(blk, parts, n_k: int):
    """The block's (dq, dk, dv) without the sink's key: its dK and dV rows are no gradient of an input."""
    if blk.sink is None:
        return parts
    dq, dk, dv = parts
    return dq, tuple(x[..., :n_k, :] for x in dk), tuple(x[..., :n_k, :] for x in dv)


def _largest_magnitude(x):
    """max |x| ignoring NaN (rows with no visible key), as a host float (numpy) or a 0-d device tensor."""
    if isinstance(x, np.ndarray):
        return float(np.nanmax(np.abs(x), initial=0.0))
    return torch.nan_to_num(x.abs(), nan=0.0).max()


@dataclass
class BlockGradients:
    """One block's backward intermediates in float64, (p, G, R, .) arrays: the weights P^ and their bound
    E, dO, dP = dO V^T with A = |dO| |V|^T, D = dO . O^ with its error, and dS (its error ``err_dS``)."""

    weights: object
    E: object
    dO: object
    dP: object
    A: object
    D: object
    err_D: object
    dS: object
    err_dS: object
    dS_logit: object = None  # dS at the capped logits, before the cap's slope (dS itself without a cap)
    err_dS_logit: object = None


def block_gradients(ops, blk, fwd, dO, g_dot: float, scale: float) -> BlockGradients:
    """The backward's intermediates of one block of the forward walk (``fwd``: its BlockForward); with a
    cap, dS is carried back to the scaled logits (see :func:`_through_the_cap`)."""
    sm = fwd.softmax
    weights = sm.p / sm.l  # P^; 0 on masked keys and on rows with no visible key
    E = _weight_bound(ops, blk, fwd, weights)
    abs_dO = ops.abs(dO)
    dP = ops.matmul(dO, ops.swap(blk.V))
    A = ops.matmul(abs_dO, ops.swap(ops.abs(blk.V)))
    D = ops.sum(dO * fwd.out, -1)
    err_D = (ops.sum(abs_dO * fwd.bound, -1) + g_dot * ops.sum(abs_dO * ops.abs(fwd.out), -1)
             + dO.shape[-1] * SUBNORMAL) * SAFETY
    diff = dP - D
    dS = weights * diff
    err_dS = E * ops.abs(diff) + (weights + E) * (g_dot * A + err_D) + 3 * U64 * ops.abs(dS) + 2 * SUBNORMAL
    dS_logit, err_dS_logit = dS, err_dS
    if blk.cap is not None:
        dS, err_dS = _through_the_cap(ops, blk, fwd.softmax, dS, err_dS, scale)
    return BlockGradients(weights, E, dO, dP, A, D, err_D, dS, err_dS, dS_logit, err_dS_logit)


def _through_the_cap(ops, blk, sm, dS, err_dS, scale: float):
    """dS with respect to the scaled logits: the capped logits' dS times the cap's slope 1 - tanh^2(s / c),
    with its error: the slope moves by at most 2 |tanh'| |dt| <= 2 (eta / c + 4 u) where the scaled
    logit is off by eta <= |scale| gamma_{D+2} |q| . |k| + u |s| (and tanh by a few ulps)."""
    c = blk.cap
    t = ops.tanh(sm.raw / c)
    slope = 1.0 - t * t
    K = blk.K if blk.sink is None else blk.K[:, :, :-1]
    eta = abs(scale) * _gamma(blk.Q.shape[-1] + 2) * ops.matmul(ops.abs(blk.Q), ops.swap(ops.abs(K)))
    eta = eta + U64 * ops.abs(sm.raw[..., :K.shape[-2]])
    if blk.bias is not None and blk.bias_first:  # the bias's addition to the cap's input
        eta = eta + 2 * U64 * blk.bias_size
    slope_err = 2 * (eta / c + 4 * U64) + 2 * U64
    if blk.sink is not None:  # the sink is no logit of Q and K: its slope is 1
        one = 0 * slope[..., :1] + 1.0
        slope, slope_err = ops.concat((slope[..., :-1], one), -1), ops.concat((slope_err, 0 * one), -1)
    slope = ops.where(slope == slope, slope, 0.0)  # masked keys: their dS is 0 whatever the slope
    out = dS * slope
    return out, (err_dS * (slope + slope_err) + ops.abs(dS) * slope_err + U64 * ops.abs(out)) * SAFETY


def group_rows(x):
    """(p, G, R, n) as (p, G R, n): the group's query rows stacked, as dK and dV sum them."""
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], x.shape[-1])


def _gradient_block(ops, blk, bg: BlockGradients, scale: float, g_sum: float):
    """((dq, bound, scale), (dk, ...), (dv, ...)) of one block; dk and dv are this block's rows' share."""
    dO = bg.dO
    abs_dS = ops.abs(bg.dS)
    M = bg.err_dS + g_sum * abs_dS
    size = bg.weights * (ops.abs(bg.dP) + ops.abs(bg.D))  # dS's terms before they cancel
    Q, K = blk.Q, blk.K
    absK, absQ, abs_dO = ops.abs(K), ops.abs(Q), ops.abs(dO)
    a = abs(scale)
    dq = (scale * ops.matmul(bg.dS, K), a * ops.matmul(M, absK), a * ops.matmul(size, absK))
    rows = group_rows
    t = lambda x: ops.swap(rows(x))  # noqa: E731
    dk = (scale * ops.matmul(t(bg.dS), rows(Q)), a * ops.matmul(t(M), rows(absQ)), a * ops.matmul(t(size), rows(absQ)))
    dv = (ops.matmul(t(bg.weights), rows(dO)), ops.matmul(t(bg.E + g_sum * bg.weights), rows(abs_dO)),
          ops.matmul(t(bg.weights), rows(abs_dO)))
    return dq, dk, dv


def _weight_bound(ops, blk, fwd, weights):
    """E_ij >= |P^_ij - a_ij|: the forward's weight error, the rounding of p^ / l^, and a weight that
    underflowed (at most UNDERFLOW, on visible keys)."""
    err = fwd.weights
    rounding = weights * (U64 / (1 - U64))
    if err.rel is not None:
        E = weights * (err.rel / (1 - U64)) + rounding
    else:
        E = err.delta * SAFETY + rounding
    E = E + UNDERFLOW
    return E if blk.vis is None else ops.where(blk.vis, E, 0.0)


# --- audit ------------------------------------------------------------------------------------------

@dataclass
class GradientAudit:
    """The float64 gradients checked against mpmath: per gradient, the largest
    |g64 - g_mp| / (bound64 + mpmath's own error) over every element; the bound holds when it is <= 1."""

    worst_ratio: dict[str, float]
    worst_index: dict[str, tuple]
    elements: int

    @property
    def ok(self) -> bool:
        return all(r <= 1.0 for r in self.worst_ratio.values())


def audit_gradients(q, k, v, do, *, scale: float, causal: str = "none", attn_mask=None,
                    dps: int = 50, variant: Variant | None = None) -> GradientAudit:
    """Check the float64 gradients' bounds against mpmath (small cases: mpmath costs about 1 ms per
    row, head and key at D = 16)."""
    kw = dict(scale=scale, causal=causal, attn_mask=attn_mask, variant=variant)
    fast = reference_gradients(q, k, v, do, method="float64", **kw)
    slow = reference_gradients(q, k, v, do, method="mpmath", dps=dps, **kw)
    ratios, where, elements = {}, {}, 0
    for name in fast.names:
        err = (fast[name].cpu() - slow[name].cpu()).abs()
        allowed = fast.bound[name].cpu() + slow.bound[name].cpu()
        ratio = torch.where(err == 0, torch.zeros_like(err), err / allowed)
        ratio = torch.nan_to_num(ratio, nan=math.inf, posinf=math.inf)
        flat = int(torch.argmax(ratio))
        ratios[name] = float(ratio.max())
        where[name] = tuple(int(i) for i in np.unravel_index(flat, ratio.shape))
        elements += ratio.numel()
    return GradientAudit(worst_ratio=ratios, worst_index=where, elements=elements)
