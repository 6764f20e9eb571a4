"""The error budget: how far a legal kernel's output may sit from the exact one, element by element.

For a kernel that honours a precision contract (see :mod:`flashcheck.precision`), the error of output
element (i, k) under any legal order of operations is at most (DESIGN.md)

    tol_ik = u_o |o_ik| + s_o                                          output rounding
           + sum_j delta_ij |v_jk - c_k| + |c_k - o_ik| sum_j delta_ij  logit error, key by key
           + w_ik (u_p + u_v + gamma_K + c u_32)                        P cast, tf32 V, accumulation
           + s_p sum_j |v_jk| / l_i  over keys with P_ij below P's smallest normal   subnormal P

with eta_ij = |scale| ((1 + gamma_d') (1 + u_in)^2 - 1) sum_d |q_id||k_jd| + u_32 (c' |s_ij| + 2 |m_i|)
bounding the error of logit (i, j), and delta_ij the largest move of weight a_ij when every logit j
moves by at most eta_ij; d' = d, or d + 2 where the contract lets the scale multiply Q and K before the
product (PyTorch's math backend scales each by sqrt(scale)). Every tolerance flashcheck applies comes from this module.

Where the budget is tight on purpose: with huge logits and a near tie, a legal rounding (tf32 Q and K,
say) can hand the whole weight from key A to key B. Then delta_A = delta_B = 1, the budget's logit term
is |v_A - c| + |v_B - c| + 2 |c - o|, and the error |v_B - v_A| reaches it when the centre c lies between
v_A and v_B next to o (triangle inequality with equality). Such cases sit at err/budget just below 1
(0.99 measured, fp32 as tf32, logits near 1e5): tight, and still never above 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .blockwise import iter_blocks, ops_for, scatter
from .floats import FORMATS, TF32, format_of
from .oracle import Reference, reference_attention
from .precision import Precision, precision_named
from .validation import check_attention_inputs

__all__ = ["Budget", "BudgetTerms", "TERMS", "error_budget", "contract_terms"]

TERMS = ("output_rounding", "logit", "accumulation", "subnormal_p", "oracle")
EXTRA_ULPS = 4.0  # the final division by l, the per-tile rescale multiply and l's own rounding
LOGIT_ULPS = 4.0  # c': scale and log2(e) multiplies, the exp2 argument's rounding
MIN_TILE = 16  # rescales per key are at most one per 16 keys (the smallest tile a kernel uses)


@dataclass(frozen=True)
class BudgetTerms:
    """The unit roundoffs a precision contract allows for one input dtype."""

    dtype: str
    u_o: float  # output rounding
    s_o: float  # output rounding near zero (half the subnormal spacing)
    u_p: float  # rounding of P before P @ V
    s_p: float  # absolute rounding of P below its smallest normal
    p_min_normal: float
    u_v: float  # rounding of V inside the matmul (tf32)
    u_in: float  # rounding of Q and K inside the first matmul (tf32)
    u_32: float  # fp32 accumulators
    exp_ulps: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def contract_terms(precision: Precision | str, dtype) -> BudgetTerms:
    """The roundoffs of ``precision`` for inputs of ``dtype``."""
    precision = precision_named(precision)
    fmt = format_of(dtype)
    fp32 = FORMATS["fp32"]
    tf32 = precision.tf32 and fmt.name == "fp32"
    # tf32 conversion may truncate: a full 2^-10, not round-to-nearest's 2^-11 (measured).
    u_tf32 = 2 * TF32.unit_roundoff if tf32 else 0.0
    p_fmt = fmt if precision.p_dtype == "input" else fp32
    return BudgetTerms(
        dtype=fmt.name,
        u_o=fmt.unit_roundoff,
        s_o=fmt.subnormal_spacing / 2,
        u_p=max(p_fmt.unit_roundoff if precision.p_dtype == "input" else 0.0, u_tf32),
        s_p=p_fmt.subnormal_spacing / 2,
        p_min_normal=p_fmt.smallest_normal,
        u_v=u_tf32,
        u_in=u_tf32,
        u_32=fp32.unit_roundoff,
        exp_ulps=float(precision.exp_ulps),
    )


def _gamma(n: float, u: float) -> float:
    return n * u / (1 - n * u)


@dataclass
class Budget:
    """Per-element tolerance with its terms, all float64 tensors of the output's shape (B, Hq, R, Dv).

    ``total`` is the sum of ``terms``; ``terms["oracle"]`` is the oracle's own certified error.
    """

    total: torch.Tensor
    terms: dict[str, torch.Tensor]
    reference: Reference
    contract: BudgetTerms
    precision: Precision
    delta_sum: torch.Tensor = field(repr=False)  # (B, Hq, R): sum_j delta_ij, how far the row's weights may move
    lse_total: torch.Tensor = field(repr=False)  # (B, Hq, R): tolerance of a returned lse

    def breakdown(self, index: tuple) -> dict[str, float]:
        """The budget of one element, term by term."""
        out = {name: float(t[index]) for name, t in self.terms.items()}
        out["total"] = float(self.total[index])
        return out


def error_budget(q, k, v, *, scale: float, causal: str = "none", attn_mask=None,
                 precision: Precision | str = "flash", reference: Reference | None = None,
                 rows=None) -> Budget:
    """The per-element budget of a kernel honouring ``precision`` on this input."""
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    precision = precision_named(precision)
    if reference is None:
        reference = reference_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, rows=rows)
    rows_all = reference.rows if reference.rows is not None else torch.arange(shapes.n_q)
    terms = contract_terms(precision, q.dtype)
    device = q.device
    ops = ops_for(device)
    shape = reference.out.shape
    names = ("output_rounding", "logit", "accumulation", "subnormal_p")
    parts = {n: torch.zeros(shape, dtype=torch.float64, device=device) for n in names}
    delta_sum = torch.zeros(shape[:-1], dtype=torch.float64, device=device)
    lse_shift = torch.zeros_like(delta_sum)
    D, Nk = shapes.head_dim, shapes.n_k
    u = terms.u_32
    # D products and sums in fp32 (two more roundings when Q and K are scaled first), on operands that
    # tf32 may have rounded.
    dot_len = D + 2 * precision.scale_on_inputs
    logit_factor = abs(scale) * ((1 + _gamma(dot_len, u)) * (1 + terms.u_in) ** 2 - 1)
    accumulation_len = Nk + math.ceil(Nk / MIN_TILE) + 1
    w_factor = terms.u_p + terms.u_v + _gamma(accumulation_len, u) + (terms.exp_ulps + EXTRA_ULPS) * u
    outputs = (parts["output_rounding"], parts["logit"], parts["accumulation"], parts["subnormal_p"], delta_sum,
               lse_shift)
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        for blk in iter_blocks(ops, q, k, v, causal, attn_mask, shapes, rows_all):
            if blk.new_kv:
                absV = ops.abs(blk.V)
                absK = ops.abs(blk.K)
                centre = ops.sum(blk.V, 0) / Nk
                dev_v = ops.abs(blk.V - centre)
            res = _budget_block(ops, blk, absV, absK, centre, dev_v, scale, logit_factor, w_factor, terms)
            scatter(ops, outputs, blk, res, device)
    empty = reference.empty_rows[..., None]
    for n in names:
        parts[n] = parts[n].masked_fill(empty, 0.0)
    parts["oracle"] = torch.nan_to_num(reference.bound, nan=0.0)
    total = sum(parts[n] for n in TERMS)
    # lse: the logit shift of the row, fp32 rounding of m + log(l), and l's accumulation.
    lse_total = (lse_shift + u * (LOGIT_ULPS * reference.lse.abs() + LOGIT_ULPS)
                 + _gamma(accumulation_len, u) + reference.lse_bound)
    return Budget(total=total, terms=parts, reference=reference, contract=terms, precision=precision,
                  delta_sum=delta_sum.masked_fill(reference.empty_rows, 0.0),
                  lse_total=lse_total.masked_fill(reference.empty_rows, 0.0))


def _budget_block(ops, blk, absV, absK, centre, dev_v, scale, logit_factor, w_factor, t: BudgetTerms):
    neg_inf = -math.inf
    vis = blk.vis
    s = ops.matmul(blk.Q, blk.K.T) * scale
    s_vis = ops.where(vis, s, neg_inf)
    m = ops.amax(s_vis, 1)
    empty = m == neg_inf
    m = ops.where(empty, 0.0, m)
    x = s_vis - m
    p = ops.exp(x)  # unnormalised weights relative to the final max, as a kernel ends with them
    l = ops.where(empty, 1.0, ops.sum(p, 1))
    log_a = x - ops.log(l)
    a = p / l
    both = ops.matmul(a, ops.concat((blk.V, absV), 1))
    Dv = absV.shape[1]
    o, w = both[:, :Dv], both[:, Dv:]
    # eta: how far a legal kernel's logit j may sit from the exact one (0 on masked keys).
    qk = ops.matmul(ops.abs(blk.Q), absK.T)
    eta = logit_factor * qk + t.u_32 * (LOGIT_ULPS * ops.abs(ops.where(vis, s, 0.0)) + 2 * ops.abs(m))
    eta = ops.where(vis, eta, 0.0)
    delta, lse_shift = _weight_shift(ops, log_a, eta, vis)
    delta_sum = ops.sum(delta, 1)
    logit = ops.matmul(delta, dev_v) + ops.abs(centre - o) * delta_sum
    accumulation = w * w_factor
    output_rounding = t.u_o * ops.abs(o) + t.s_o
    small = ops.float64(vis & (p < t.p_min_normal))
    subnormal_p = ops.matmul(small, absV) * (t.s_p / l)
    return output_rounding, logit, accumulation, subnormal_p, delta_sum, lse_shift


def _weight_shift(ops, log_a, eta, vis):
    """(delta, lse shift) with delta_ij = min(1, max(a e^eta / Rmin - a, a - a e^-eta / Rmax)), in the log domain.

    Rmin = sum_j a_j e^-eta_j and Rmax = sum_j a_j e^eta_j: the weights sum to one, so when every
    logit j moves by at most eta_j, weight j moves by at most delta_j (per key, not per row).
    """
    neg_inf = -math.inf
    log_a = ops.where(vis, log_a, neg_inf)
    log_rmax = ops.logsumexp(log_a + eta, 1)
    log_rmin = ops.logsumexp(log_a - eta, 1)
    a = ops.exp(log_a)
    up = eta - log_rmin
    down = -eta - log_rmax
    # expm1 keeps precision for small moves; the direct difference handles a weight that underflows.
    upper = ops.where(up < 0.5, a * ops.expm1(up), ops.exp(log_a + up) - a)
    lower = -a * ops.expm1(down)
    delta = ops.minimum(ops.maximum(upper, lower), 1.0)
    delta = ops.where(vis, ops.where(delta == delta, delta, 1.0), 0.0)
    # The row's log-sum-exp moves by at most max(log Rmax, -log Rmin).
    lse_shift = ops.maximum(log_rmax, -log_rmin)
    return delta, ops.where(lse_shift == lse_shift, lse_shift, 0.0)
