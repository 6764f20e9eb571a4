"""The oracle: attention in float64 with a certified bound on its own error, and an mpmath auditor.

Inputs are fp16/bf16/fp32, so every product q_id * k_jd and p_ij * v_jk of the first matmul is exact in
float64; the only errors are float64 roundings, which this module bounds element by element.

Error analysis of ``method="float64"`` (u = 2^-53, gamma_n = n u / (1 - n u)). The computation is

    s^ = fl(fl(Q K^T) * scale);  m = max_j s^;  x = fl(s^ - m);  p^ = fl(exp(x))
    l^ = fl(sum_j p^);  o^ = fl(fl(p^ V) / l^);  w^ = fl(fl(p^ |V|) / l^);  lse^ = m + log(l^)

1. Every computed weight is exact for a perturbed logit: p^_ij = exp(s_ij - m + theta_ij) with
   |theta_ij| <= eta_ij = |scale| gamma_D sum_d |q_id||k_jd| + u|s^_ij| + u|x_ij| + eps_exp.
   Cauchy-Schwarz bounds sum_d |q_id||k_jd| and |s_ij| by ||q_i|| ||k_j||, and |x_ij| <= |s_ij| + |m_i|,
   so eta_ij <= C ||q_i|| ||k_j|| + u|m_i| + eps_exp <= eta_max_i = C ||q_i|| max_j ||k_j|| + u|m_i|
   + eps_exp: the bound costs no pass over the N x N scores and no column of the P @ V product beyond
   w's (a per-key eta costs Dv + 1 more columns of it, to tighten a bound that sits ~1e-13 relative,
   far below the formats judged).
2. The weights a~ = p^ / sum p^ differ from the exact a by delta_ij (the per-key weight shift of
   docs/design.md). For eta tiny (the usual case) expm1 and log1p are linear to within 2^-20, which gives
   delta_ij <= a~_ij (eta_ij + r_i)(1 + 2^-19) with r_i = sum_j a~_ij eta_ij (1 + 2^-20) <= eta_max_i
   (1 + 2^-20). Rows with larger eta (logits near 1e60 and beyond) use the exact log-domain formula,
   key by key.
3. sum_j (a - a~)_ij v_jk is bounded by sum_j delta_ij |v_jk|; the float64 matmul, sum and division add
   at most 2 gamma_{N+1} w^_ik; keys whose weight underflowed add at most N 2^-1073 max_j |v_jk|.

Every term is first order; a final factor (1 + 2^-16) covers the second-order remainder and the
rounding of the bound's own arithmetic, which are below 2^-30 relative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..contract.counts import check_count
from ..contract.formats import FP64
from ..contract.validation import Shapes, check_attention_inputs
from ..errors import FlashcheckError, InvalidArgument
from ..features.scores import capped_scores
from ..features.variant import Variant, check_shapes
from .answers import Reference
from .blockwise import AttentionCall, iter_blocks, ops_for, scatter
from .exact import mpmath_reference

__all__ = ["Reference", "reference_attention"]

U64 = FP64.unit_roundoff
EPS_EXP = 4 * U64 / (1 - 4 * U64)  # exp of numpy / torch float64: far inside 4 ulps
TINY_ETA = 2.0**-20  # below this, first-order expansions are certified to 2^-20 relative
SAFETY = 1 + 2.0**-16
UNDERFLOW = 2.0**-1073  # largest weight an underflowed exp can hide, twice the smallest subnormal
METHODS = ("float64", "mpmath")


def _gamma(n: int) -> float:
    return n * U64 / (1 - n * U64)


def reference_attention(q, k, v, *, scale: float, causal: str = "none", attn_mask=None,
                        method: str = "float64", dps: int = 50,
                        rows: Sequence[int] | None = None, variant: Variant | None = None) -> Reference:
    """Attention computed exactly enough to judge a kernel, with a bound on its own error.

    ``method="float64"`` runs in numpy on the CPU and in torch float64 on a GPU. ``method="mpmath"``
    computes the same quantities with ``dps`` decimal digits (an auditor: about 1 ms per row and
    head at N = 100, D = 64). ``rows`` restricts either method to the given query indices.
    ``variant``: the case's cap, bias, visible keys and sink (:class:`~flashcheck.features.variant.Variant`).
    """
    call = _checked_call(q, k, v, scale, causal, attn_mask, variant)
    if method not in METHODS:
        raise InvalidArgument("method", method, "unknown oracle method", f"Use one of {list(METHODS)}.")
    check_count("dps", dps, minimum=20, maximum=10_000, what="a number of digits",
                fix="Pass dps=50 (the default) or more digits for extreme inputs.")
    row_index = _check_rows(rows, call.shapes.n_q)
    values = call.dequantized()
    if method == "mpmath":
        for name, t in zip("qkv", (values.q, values.k, values.v)):
            _check_finite(name, t, bool(torch.isfinite(t).all()))
        ref = mpmath_reference(values, row_index, dps)
    else:
        ref = _float64_reference(values, row_index)
    ref.inputs = _inputs(call)
    return ref


def float64_reference_walk(q, k, v, *, scale: float, causal: str, attn_mask, rows, on_block,
                           variant: Variant | None = None) -> Reference:
    """The float64 oracle of :func:`reference_attention` with a hook on every block (for the budget)."""
    call = _checked_call(q, k, v, scale, causal, attn_mask, variant)
    ref = _float64_reference(call.dequantized(), _check_rows(rows, call.shapes.n_q), on_block)
    ref.inputs = _inputs(call)
    return ref


def _checked_call(q, k, v, scale, causal, attn_mask, variant) -> AttentionCall:
    """The call validated, its variant too (None: plain attention); q, k and v as given."""
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return AttentionCall(q, k, v, scale, causal, attn_mask, shapes, _check_variant(variant, shapes))


def _inputs(call: AttentionCall) -> dict:
    """What :attr:`Reference.inputs` records of the call it answers (q, k and v as the caller gave them)."""
    return dict(q=call.q, k=call.k, v=call.v, scale=call.scale, causal=call.causal, attn_mask=call.attn_mask,
                variant=call.variant)


def _check_variant(variant, shapes: Shapes) -> Variant:
    if variant is None:
        return Variant()
    if not isinstance(variant, Variant):
        raise InvalidArgument("variant", variant, "expected a flashcheck.Variant",
                              "Pass the case's features as a flashcheck.Variant, or None for plain attention.")
    check_shapes(variant, shapes)
    return variant


def _check_finite(name: str, tensor, finite: bool) -> None:
    if not finite:
        raise InvalidArgument(name, tensor, "contains NaN or infinity",
                              "The oracle needs finite inputs; replace masked-out padding by any finite value "
                              "(it cannot change the exact answer).")


def _check_rows(rows, n_q: int) -> torch.Tensor | None:
    if rows is None:
        return None
    try:
        index = torch.as_tensor(list(rows) if not isinstance(rows, torch.Tensor) else rows,
                                dtype=torch.int64).reshape(-1).cpu()
    except (TypeError, ValueError, RuntimeError):
        index = None
    if index is None or index.numel() == 0 or bool((index < 0).any()) or bool((index >= n_q).any()):
        raise InvalidArgument("rows", rows, f"expected query indices in [0, {n_q})",
                              "Pass a non-empty list of row indices, or None for every row.")
    return index


# --- float64 ----------------------------------------------------------------------------------------

@dataclass
class Softmax:
    """One block's scaled logits and unnormalised weights, shared by the oracle and the budget.

    Arrays are (p, G, R, Nk) or, reduced over the keys, (p, G, R, 1); masked keys have s = -inf, p = 0.
    """

    s: object  # scaled logits (capped when the variant caps them; the sink as a last column)
    raw: object  # the scaled logits before the cap (s itself without one)
    m: object  # row max (0 on empty rows)
    empty: object  # rows with no visible key
    x: object  # s - m
    p: object  # exp(x)
    l: object  # sum of p (1 on empty rows)


def block_scores(ops, blk, scale: float):
    """(raw, s): the block's cap input (the scaled logits, with the bias where it goes first or there is no
    cap), and its logits as the variant has them: capped and biased, with the sink's logit as the
    last column (Block's sink key)."""
    K = blk.K if blk.sink is None else blk.K[:, :, :-1]
    raw = ops.matmul(blk.Q, ops.swap(K)) * scale
    late = blk.bias is not None and blk.cap is not None and not blk.bias_first
    raw, s = capped_scores(raw, blk.bias, blk.cap, late, ops.tanh)
    if blk.sink is not None:
        sink = ops.broadcast_to(blk.sink, s.shape[:-1] + (1,))
        raw, s = ops.concat((raw, sink), -1), ops.concat((s, sink), -1)
    return raw, s


def block_softmax(ops, blk, scale: float) -> Softmax:
    raw, s = block_scores(ops, blk, scale)
    if blk.vis is not None:
        s = ops.where(blk.vis, s, -math.inf)
    m = ops.amax(s, -1)
    empty = m == -math.inf
    m = ops.where(empty, 0.0, m)
    x = s - m
    p = ops.exp(x)
    return Softmax(s, raw, m, empty, x, p, ops.where(empty, 1.0, ops.sum(p, -1)))


def _bias_rho(ops, blk):
    """What the bias adds to eta_ij, per row: its addition to the logit (u |b|, and u |b| more in |s|),
    the subtraction of the max (u |b| through |x| and |m|) and a product forming it (u |b|): 5 u max_j |b_ij|."""
    if blk.bias is None:
        return 0.0
    n_k = blk.K.shape[-2] - (blk.sink is not None)
    size = blk.bias_size if blk.vis is None else ops.where(blk.vis[..., :n_k], blk.bias_size, 0.0)
    return 5 * U64 * ops.amax(size, -1)


def _call_checks(q, k, v, shapes: Shapes, rows, scale: float, C: float, rho_extra: float) -> bool:
    """Check the inputs once for the whole call, in one host sync (never a pass over the scores):
    finite, and scaled logits that cannot overflow (|s_ij| <= |scale| ||q_i|| ||k_j||). Returns whether
    every row's eta_max is small enough for the first-order bound, so that blocks need not ask."""
    P = shapes.batch * shapes.heads_kv
    q_rows = q if rows is None else q.index_select(2, rows.to(q.device))
    q_norm = torch.linalg.vector_norm(q_rows.detach().double().reshape(P, -1, shapes.head_dim), dim=-1).amax(-1)
    k_norm = torch.linalg.vector_norm(k.detach().double().reshape(P, -1, shapes.head_dim), dim=-1).amax(-1)
    top = (q_norm * k_norm).amax()
    flags = torch.stack([torch.isfinite(t).all().double() for t in (q, k, v)] + [top]).tolist()
    for name, t, ok in zip("qkv", (q, k, v), flags):
        _check_finite(name, t, bool(ok))
    if not abs(scale) * flags[3] < 1e300:
        raise FlashcheckError("scaled logits overflow float64; the oracle cannot bound this case "
                              "(|scale| * |q| * |k| above 1e300)")
    # |m_i| <= |s^_ij| <= 2 |scale| ||q_i|| ||k_j||, so eta_max_i <= (C + 2 u |scale|) max ||q|| ||k|| + eps_exp.
    eta_top = (C + 2 * U64 * abs(scale)) * flags[3] + EPS_EXP + rho_extra
    return eta_top * (2 + TINY_ETA) <= TINY_ETA


def _bias_extent(variant: Variant, shapes: Shapes) -> float:
    """5 u times the largest bias magnitude of the call (:func:`_bias_rho` for every row at once), each bias
    feature's bounded without a pass over the scores; an infinite bias (a hidden key) rounds nothing."""
    if not variant.biased:
        return 0.0
    top = 0.0
    for f in variant.biasing():
        top += f.bias_extent(variant, shapes.n_q, shapes.n_k)
    return 5 * U64 * top


def _variant_error(variant: Variant, scale: float) -> tuple[float, float]:
    """What the variant adds to eta_ij: (to C, to rho). A cap rounds s / c (u |s|, through tanh' <= 1), its
    tanh (well inside 4 ulps of |tanh| <= 1) and the multiply by c, and bounds |x| by 2c: 8 u c in all. A
    sink's logit is exact; its x = sink - m rounds by u |x| <= 746 u while its weight e^x does not underflow."""
    cap = variant.cap
    to_c = U64 * abs(scale) * (1 + U64) if cap is not None else 0.0
    to_rho = (8 * U64 * cap if cap is not None else 0.0) + (746 * U64 if variant.sink is not None else 0.0)
    return to_c, to_rho


def _float64_reference(call: AttentionCall, row_index, on_block=None) -> Reference:
    """The float64 oracle; ``on_block(block, forward)`` sees each block's :class:`BlockForward` (the
    budget and the gradients use it, so that one walk over the scores gives them all)."""
    shapes, scale, variant, device = call.shapes, call.scale, call.variant, call.q.device
    ops = ops_for(device)
    B, Hq, Nq, Dv = shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v
    rows_all = row_index if row_index is not None else torch.arange(Nq)
    R = rows_all.numel()
    out = torch.empty((B, Hq, R, Dv), dtype=torch.float64, device=device)
    w, bound = torch.empty_like(out), torch.empty_like(out)
    lse = torch.empty((B, Hq, R), dtype=torch.float64, device=device)
    lse_bound = torch.empty_like(lse)
    empty = torch.empty((B, Hq, R), dtype=torch.bool, device=device)
    outputs = (out, w, bound, lse, lse_bound, empty)
    # eta_ij <= C ||q_i|| ||k_j|| + u |m_i| + eps_exp: the dot's rounding, the scale multiply (|s| is
    # at most |scale| ||q|| ||k||) and the subtraction of the max (|x| <= |s| + |m|).
    to_c, to_rho = _variant_error(variant, scale)
    C = abs(scale) * (_gamma(shapes.head_dim + 2) + 2 * U64) * (1 + U64) + to_c
    small_eta = _call_checks(call.q, call.k, call.v, shapes, row_index, scale, C,
                             to_rho + _bias_extent(variant, shapes))
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # inf/nan handled (delta <= 1)
        for blk in iter_blocks(ops, call, rows_all, allow_none=True):
            forward, res = _float64_block(ops, blk, scale, C, small_eta, to_rho)
            scatter(ops, outputs, blk, res)
            if on_block is not None:
                on_block(blk, forward)
    return Reference(out=out, lse=lse, w=w, bound=bound, lse_bound=lse_bound, empty_rows=empty,
                     method="float64", rows=row_index, shapes=shapes)


@dataclass
class WeightError:
    """How far the computed weights a~_ij = p^_ij / l^_i may sit from the exact a_ij, for one block:
    |a~_ij - a_ij| <= ``rel_i`` a~_ij on rows of small eta (``rel`` (p, G, R, 1)), else <= ``delta_ij``
    (``delta`` (p, G, R, Nk), exact per key, for the whole block); ``lse_shift`` bounds the lse's move."""

    rel: object | None
    delta: object | None
    lse_shift: object


@dataclass
class BlockForward:
    """One block of the float64 oracle as computed: the softmax, out and w (``out`` is 0, not NaN, on
    empty rows), the bound on out (0 on empty rows) and the weights' error."""

    softmax: Softmax
    out: object
    w: object
    bound: object
    weights: WeightError


def _weight_error(ops, blk, sm: Softmax, C, small_eta: bool, q_norm, k_norm, to_rho: float) -> WeightError:
    # eta_max = C ||q_i|| max_j ||k_j|| + rho_i bounds every eta_ij of the row, and so r_i too.
    rho = U64 * ops.abs(sm.m) + EPS_EXP + to_rho + _bias_rho(ops, blk)
    eta_max = C * q_norm * ops.amax(k_norm, -2) + rho
    r = eta_max * (1 + TINY_ETA)
    if small_eta or bool((eta_max + r <= TINY_ETA).all()):
        # delta_ij <= a~_ij (eta_ij + r_i)(1 + 2^-19) <= a~_ij (eta_max + r_i)(1 + 2^-19)
        return WeightError(rel=(eta_max + r) * (1 + 2 * TINY_ETA), delta=None, lse_shift=r)
    eta = C * q_norm * ops.swap(k_norm) + rho
    eta = eta if blk.vis is None else ops.where(blk.vis, eta, 0.0)
    delta, lse_shift = _large_eta_shift(ops, sm, eta)
    return WeightError(rel=None, delta=delta, lse_shift=lse_shift)


def _float64_block(ops, blk, scale, C, small_eta: bool, to_rho: float) -> tuple[BlockForward, tuple]:
    """One block: its :class:`BlockForward`, and the results out, w, bound, lse, lse_bound and empty,
    each (p, G, R, .), with empty rows marked. ``small_eta``: the whole call is known to take the
    first-order bound (else the block finds out)."""
    Q, K, V = blk.Q, blk.K, blk.V
    absV = ops.abs(V)
    k_norm = ops.sqrt(ops.sum(K * K, -1))  # (p, 1, Nk, 1)
    q_norm = ops.sqrt(ops.sum(Q * Q, -1))  # (p, G, R, 1)
    sm = block_softmax(ops, blk, scale)
    Dv = V.shape[-1]
    # One matmul gives out and w: P @ [V, |V|] (the bound needs no column of its own).
    res = ops.matmul(sm.p, ops.concat((V, absV), -1)) / sm.l
    out, w = res[..., :Dv], res[..., Dv:]
    weights = _weight_error(ops, blk, sm, C, small_eta, q_norm, k_norm, to_rho)
    if weights.rel is not None:
        shift = weights.rel * w  # sum_j delta_ij |v_jk| <= rel_i w_ik
    else:
        shift = ops.matmul(weights.delta, absV)
    # Keys whose weight underflows can hide at most UNDERFLOW each (l^ >= 1).
    underflow = (K.shape[-2] * UNDERFLOW) * ops.amax(absV, -2)
    g = _gamma(K.shape[-2] + 1)
    bound = (shift + 2 * g * w * (1 + 2 * g) + underflow) * SAFETY
    log_l = ops.log(sm.l)
    lse = sm.m + log_l
    lse_bound = (weights.lse_shift + g + 4 * U64 * ops.abs(log_l) + 2 * U64 * ops.abs(lse)) * SAFETY
    empty = sm.empty
    forward = BlockForward(sm, out, w, ops.where(empty, 0.0, bound), weights)
    return forward, (ops.where(empty, math.nan, out), ops.where(empty, 0.0, w), ops.where(empty, math.nan, bound),
                     ops.where(empty, -math.inf, lse), ops.where(empty, 0.0, lse_bound), empty)


def _large_eta_shift(ops, sm: Softmax, eta):
    """Exact per-key weight shift (docs/design.md's delta) in the log domain, for rows with large eta."""
    neg_inf = -math.inf
    log_a = sm.x - ops.log(sm.l)  # -inf on masked keys already
    log_rmax = ops.logsumexp(log_a + eta, -1)
    log_rmin = ops.logsumexp(log_a - eta, -1)
    a = ops.exp(log_a)
    upper = ops.exp(log_a + eta - log_rmin) - a
    lower = a - ops.exp(log_a - eta - log_rmax)
    delta = ops.minimum(ops.maximum(upper, lower), 1.0)
    delta = ops.where(log_a > neg_inf, delta, 0.0)
    # The lse of the exact logits lies within max(log Rmax, -log Rmin) of the computed one.
    lse_shift = ops.maximum(log_rmax, -log_rmin)
    return delta, ops.where(lse_shift == lse_shift, lse_shift, 0.0)
