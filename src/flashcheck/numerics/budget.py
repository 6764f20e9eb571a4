"""The error budget: how far a legal kernel's output may sit from the exact one, element by element.

For a kernel that honours a precision contract (see :mod:`flashcheck.contract.precision`), the error of output
element (i, k) under any legal order of operations is at most (docs/design.md, section 3)

    tol_ik = u_o (|o_ik| + the terms below) + s_o                      output rounding
           + sum_j delta_ij |v_jk - c_k| + |c_k - o_ik| sum_j delta_ij  logit error, key by key
           + w_ik (u_p + u_v + gamma_K + c u_32)                        P cast, tf32 V, accumulation
           + s_p sum_j |v_jk| / l_i  over keys with P_ij below P's smallest normal   subnormal P
           + n FP32_TINY / l_i                                          flushed fp32 products and sums

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

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from ..contract.formats import FORMATS, TF32, format_of, output_format
from ..contract.precision import Precision, precision_named
from ..contract.validation import check_attention_inputs
from ..features.variant import Variant
from .blockwise import AttentionCall, iter_blocks, ops_for, scatter
from .oracle import Reference, block_softmax, float64_reference_walk

__all__ = ["Budget", "BudgetTerms", "TERMS", "error_budget", "contract_terms", "raw_logit_error"]

TERMS = ("output_rounding", "logit", "accumulation", "subnormal_p", "oracle")
EXTRA_ULPS = 4.0  # the final division by l, the per-tile rescale multiply and l's own rounding
LOGIT_ULPS = 4.0  # c': scale and log2(e) multiplies, the exp2 argument's rounding
MIN_TILE = 16  # rescales per key are at most one per 16 keys (the smallest tile a kernel uses)
# Quantized inputs: the products by their scales (q's times k's times the scale, into the logits; v's into the
# output).
SCALE_ULPS = 2.0
# fp32 values below it may be flushed to zero: GPU exp (ex2.approx.ftz) and tensor-core products and sums do.
FP32_TINY = FORMATS["fp32"].smallest_normal


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
    scale_ulps: float = 0.0  # quantized inputs: fp32 products by their scales, per logit and per output term
    # P @ V summed in a narrower format over runs of ``pv_keys`` keys before the fp32 accumulator: each partial
    # sum rounded (relative ``u_pv``, absolute ``s_pv`` near zero)
    u_pv: float = 0.0
    s_pv: float = 0.0
    pv_keys: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def contract_terms(precision: Precision | str, dtype, scheme=None) -> BudgetTerms:
    """The roundoffs of ``precision`` for inputs of ``dtype`` (quantized by ``scheme``, a
    :class:`~flashcheck.contract.quantization.Scheme`, where ``dtype`` is fp8 or holds the scheme's codes)."""
    precision = precision_named(precision)
    fmt = format_of(dtype)
    fp32 = FORMATS["fp32"]
    inside = scheme is not None and scheme.quantizer is not None  # the oracle attends its quantizer's values
    tf32 = precision.tf32 and fmt.name == "fp32" and not inside  # an inside quantizer's matmuls take its formats
    # tf32 conversion may truncate: a full 2^-10, not round-to-nearest's 2^-11 (measured).
    u_tf32 = 2 * TF32.unit_roundoff if tf32 else 0.0
    scheme = scheme if inside or (scheme is not None and scheme.holds_codes(fmt.name)) else None
    compute = FORMATS[scheme.compute_format(fmt.name)] if scheme is not None and scheme.compute else None
    named_p = FORMATS[scheme.p_format] if scheme is not None and scheme.p_format else None
    p_fmt = named_p or compute or (fmt if precision.p_dtype == "input" else fp32)
    p_scale = scheme.p_scale if scheme is not None else 1.0  # P times it before its rounding: smaller steps
    u_in = max(u_tf32, _compute_rounding(compute, scheme))
    out_fmt = output_format(fmt)  # fp8 kernels write bf16
    pv_fmt, pv_keys = (FORMATS[scheme.pv_sums[0]], scheme.pv_sums[1]) if scheme and scheme.pv_sums else (None, 0)
    # a scale per tensor may multiply the output after its rounding (FlashInfer's ``out *= v_scale``): two roundings
    twice = scheme is not None and scheme.tensor_scales
    return BudgetTerms(
        dtype=fmt.name,
        u_o=(1 + out_fmt.unit_roundoff) ** 2 - 1 if twice else out_fmt.unit_roundoff,
        s_o=out_fmt.subnormal_spacing / 2,
        u_p=max(p_fmt.unit_roundoff if precision.p_dtype == "input" or compute or named_p else 0.0, u_tf32),
        # an fp32 P below its smallest normal may be flushed
        s_p=max(p_fmt.subnormal_spacing / 2 / p_scale, FP32_TINY),
        p_min_normal=p_fmt.smallest_normal / p_scale,
        u_v=u_in,
        u_in=u_in,
        u_32=fp32.unit_roundoff,
        exp_ulps=float(precision.exp_ulps),
        # q's times k's times the scale into the logits, v's into the output; one more with block scales; an inside
        # quantizer's two scales multiply its exact integer dot, each maybe an ulp from IEEE's where compiled code
        # divides approximately
        scale_ulps=(SCALE_ULPS + (2 * inside or scheme.block_scaled)) if scheme is not None else 0.0,
        u_pv=pv_fmt.unit_roundoff if pv_fmt else 0.0,
        s_pv=pv_fmt.subnormal_spacing / 2 if pv_fmt else 0.0,
        pv_keys=pv_keys,
    )


def _scaled_output(terms: BudgetTerms, variant: Variant) -> BudgetTerms:
    """``terms`` for a case whose V scale per tensor may multiply the rounded output: the first rounding's absolute
    error near zero, half a subnormal step of the output in V's code units, is times v's scale (one per tensor)."""
    scheme = variant.quantization
    if not (variant.quantized and scheme.tensor_scales and "v" in scheme.quantized):
        return terms
    return dataclasses.replace(terms, s_o=terms.s_o * (1 + variant.input_scales(0, 0)[2]))


def _compute_rounding(compute, scheme) -> float:
    """The relative rounding of an input value a kernel forms in the compute format: one rounding (the fp32 product
    of code and scale, vLLM's Triton kernels), or two where the codes are held in it and the kernel rounds the block
    scale to it before the product (FlashMLA's SM90 decode)."""
    if compute is None:
        return 0.0
    u = compute.unit_roundoff
    return (1 + u) ** 2 - 1 if scheme.held_codes and scheme.block_scaled else u


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
                 rows=None, variant: Variant | None = None) -> Budget:
    """The per-element budget of a kernel honouring ``precision`` on this input (and ``variant``).

    Without a ``reference``, the oracle and the budget share one walk over the scores.
    """
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    precision = precision_named(precision)
    variant = Variant() if variant is None else variant
    model = BudgetModel(shapes, scale, precision, _scaled_output(contract_terms(precision, q.dtype,
                                                                                variant.quantization), variant),
                        sink=variant.sink is not None,
                        keys=variant.summed_keys(shapes.n_k))
    ops = ops_for(q.device)
    values = AttentionCall(q, k, v, scale, causal, attn_mask, shapes, variant).dequantized()
    parts = None

    def add(blk, sm, o, w):
        scatter(ops, parts.outputs, blk, budget_block(ops, blk, sm, o, w, model))

    def add_forward(blk, forward):
        add(blk, forward.softmax, forward.out, forward.w)

    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        if reference is None:
            rows_n = shapes.n_q if rows is None else len(rows)
            parts = _Parts((shapes.batch, shapes.heads_q, rows_n, shapes.head_dim_v), q.device)
            reference = float64_reference_walk(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                                               rows=rows, on_block=add_forward, variant=variant)
        else:
            parts = _Parts(reference.out.shape, q.device)
            rows_all = reference.rows if reference.rows is not None else torch.arange(shapes.n_q)
            for blk in iter_blocks(ops, values, rows_all, allow_none=True):
                sm = block_softmax(ops, blk, scale)
                o_w = ops.matmul(sm.p, ops.concat((blk.V, ops.abs(blk.V)), -1)) / sm.l
                add(blk, sm, o_w[..., :shapes.head_dim_v], o_w[..., shapes.head_dim_v:])
    return parts.budget(reference, model)


@dataclass
class BudgetModel:
    """The per-call constants of the budget: its contract's roundoffs and the factors they give."""

    shapes: object
    scale: float
    precision: Precision
    terms: BudgetTerms
    sink: bool = False  # the sink is one more term of l
    keys: int | None = None  # the most terms a row's sums hold (None: Nk; more where a key counts twice)

    def __post_init__(self):
        u = self.terms.u_32
        scaled = self.terms.scale_ulps
        self.logit_ulps = LOGIT_ULPS + scaled
        # D products and sums in fp32 (two more roundings when Q and K are scaled first), on operands
        # that tf32 may have rounded.
        dot_len = self.shapes.head_dim + 2 * self.precision.scale_on_inputs
        self.logit_factor = abs(self.scale) * ((1 + _gamma(dot_len, u)) * (1 + self.terms.u_in) ** 2 - 1)
        keys = max(self.shapes.n_k, self.keys or 0)
        self.accumulation_len = keys + math.ceil(keys / MIN_TILE) + 1 + self.sink
        self.w_factor = (self.terms.u_p + self.terms.u_v + _gamma(self.accumulation_len, u)
                         + (self.terms.exp_ulps + EXTRA_ULPS + scaled) * u)
        if self.terms.pv_keys:  # a run's partial sums of P V, each rounded: gamma_n of the run's |p| |v|
            self.w_factor += _gamma(min(self.terms.pv_keys, keys), self.terms.u_pv) * (1 + self.w_factor)


class _Parts:
    """The budget's output tensors, filled block by block."""

    NAMES = ("output_rounding", "logit", "accumulation", "subnormal_p")

    def __init__(self, shape, device):
        self.terms = {n: torch.zeros(shape, dtype=torch.float64, device=device) for n in self.NAMES}
        self.delta_sum = torch.zeros(shape[:-1], dtype=torch.float64, device=device)
        self.lse_shift = torch.zeros_like(self.delta_sum)
        self.outputs = (*self.terms.values(), self.delta_sum, self.lse_shift)

    def budget(self, reference: Reference, model: BudgetModel) -> Budget:
        empty = reference.empty_rows
        parts = {n: t.masked_fill(empty[..., None], 0.0) for n, t in self.terms.items()}
        parts["oracle"] = torch.nan_to_num(reference.bound, nan=0.0)
        total = sum(parts[n] for n in TERMS)
        lse_total = lse_tolerance(self.lse_shift, reference.lse.abs(), reference.lse_bound, model)
        return Budget(total=total, terms=parts, reference=reference, contract=model.terms,
                      precision=model.precision, delta_sum=self.delta_sum.masked_fill(empty, 0.0),
                      lse_total=lse_total.masked_fill(empty, 0.0))


def lse_tolerance(lse_shift, lse_abs, lse_bound, model: BudgetModel):
    """Tolerance of a legal kernel's lse: the logit shift of the row, fp32 rounding of m + log(l), l's
    accumulation, and the oracle's own bound."""
    u = model.terms.u_32
    return lse_shift + u * (LOGIT_ULPS * lse_abs + LOGIT_ULPS) + _gamma(model.accumulation_len, u) + lse_bound


def logit_error(ops, blk, sm, model: BudgetModel):
    """eta_ij: how far a legal kernel's logit j may sit from the exact one (0 on masked keys). A sink's
    logit has a zero key (|q||k| = 0): only its conversion to the exp2 domain and the max's subtraction."""
    eta, raw_abs = raw_logit_error(ops, blk, sm, model)
    # The bias's own arithmetic (a product forming it, the addition, log2 e), on its size; into the cap's
    # input where the bias goes first.
    bias_err = 0.0
    if blk.bias is not None:
        bias_err = _bias_column(ops, blk, model.terms.u_32 * (LOGIT_ULPS + 2) * blk.bias_size)
    late = blk.cap is not None and not blk.bias_first
    eta = eta if late else eta + bias_err
    if blk.cap is not None:
        eta = _capped_error(ops, blk, eta, raw_abs, ops.abs(_visible(ops, blk, sm.s)), model)
    eta = eta + bias_err if late else eta
    return _visible(ops, blk, eta + 2 * model.terms.u_32 * ops.abs(sm.m))


def _bias_column(ops, blk, x):
    """``x`` over the block's Nk keys as (.., Nk + 1) with a 0 for the sink's column (a sink has no bias)."""
    if blk.sink is None:
        return x
    x = ops.broadcast_to(x, tuple(blk.Q.shape[:-1]) + (blk.K.shape[-2] - 1,))
    return ops.concat((x, 0 * x[..., :1]), -1)


def _visible(ops, blk, x):
    return x if blk.vis is None else ops.where(blk.vis, x, 0.0)


def raw_logit_error(ops, blk, sm, model: BudgetModel):
    """(error, magnitude) of the scaled logits before any cap: the dot's fp32 accumulation on tf32-rounded
    operands, the scale multiply (and the division by the cap); 0 on masked keys."""
    abs_q, abs_k = ops.abs(blk.Q), ops.swap(ops.abs(blk.K))
    qk = ops.matmul(abs_q, abs_k)
    raw_abs = ops.abs(_visible(ops, blk, sm.raw))
    eta = model.logit_factor * qk + model.terms.u_32 * model.logit_ulps * raw_abs
    if blk.slack is not None:  # codes a kernel's own quantizer may round the other way: one code each
        dq, dk = blk.slack[0], ops.swap(blk.slack[1])
        eta = eta + abs(model.scale) * (ops.matmul(dq, abs_k) + ops.matmul(abs_q, dk) + ops.matmul(dq, dk))
    return eta, raw_abs


def _capped_error(ops, blk, eta, raw_abs, s_abs, model: BudgetModel):
    """The error of c tanh(s / c) when s is off by at most eta: the largest slope of the cap on that
    interval times eta (mean value theorem; sech^2 <= min(1 - tanh^2, 4 e^-2t)), plus the kernel's tanh
    error (absolute, the contract's ``tanh_error``) times c and the roundings of the capped logit."""
    c = blk.cap
    t = ops.maximum(raw_abs - eta, 0.0) / c
    slope = ops.minimum(1.0 - ops.tanh(t) ** 2 + 2.0**-50, 4 * ops.exp(-2 * t))
    capped = slope * eta + c * model.precision.tanh_error + model.terms.u_32 * LOGIT_ULPS * s_abs
    if blk.sink is None:
        return capped
    return ops.concat((capped[..., :-1], eta[..., -1:]), -1)  # the sink is not capped


def budget_block(ops, blk, sm, o, w, model: BudgetModel, eta=None):
    """The budget's terms on one block, from the softmax the oracle computed (o, w: its out and w;
    ``eta``: the block's :func:`logit_error`, when the caller has it)."""
    t, vis = model.terms, blk.vis
    absV = ops.abs(blk.V)
    eta = logit_error(ops, blk, sm, model) if eta is None else eta
    delta, lse_shift = _weight_shift(ops, sm.x - ops.log(sm.l), eta, vis)
    delta_sum = ops.sum(delta, -1)
    centre = ops.sum(blk.V, -2) / blk.V.shape[-2]
    logit = ops.matmul(delta, ops.abs(blk.V - centre)) + ops.abs(centre - o) * delta_sum
    small = sm.p < t.p_min_normal  # unnormalised weights relative to the final max, as a kernel ends with them
    small = ops.float64(small if vis is None else vis & small)
    # Each product and sum of the fp32 accumulation (keys, rescales) may be flushed to zero as well.
    subnormal_p = ops.matmul(small, absV) * (t.s_p / sm.l) + model.accumulation_len * FP32_TINY / sm.l
    if t.pv_keys:  # each of a row's partial sums of P V near zero, where the narrow format's spacing is absolute
        subnormal_p = subnormal_p + model.shapes.n_k * t.s_pv / sm.l
    accumulation = w * model.w_factor
    # The output is rounded where the kernel's value lies, which the other terms let move from o: with huge
    # logits a legal kernel may hand a row's weight to another key, far from o.
    output_rounding = t.u_o * (ops.abs(o) + logit + accumulation + subnormal_p) + t.s_o
    return output_rounding, logit, accumulation, subnormal_p, delta_sum, lse_shift


def _weight_shift(ops, log_a, eta, vis):
    """(delta, lse shift) with delta_ij = min(1, max(a e^eta / Rmin - a, a - a e^-eta / Rmax)), in the log domain.

    Rmin = sum_j a_j e^-eta_j and Rmax = sum_j a_j e^eta_j: the weights sum to one, so when every
    logit j moves by at most eta_j, weight j moves by at most delta_j (per key, not per row).
    """
    log_rmax = ops.logsumexp(log_a + eta, -1)  # masked keys have log_a = -inf already
    log_rmin = ops.logsumexp(log_a - eta, -1)
    a = ops.exp(log_a)
    up = eta - log_rmin
    down = -eta - log_rmax
    # expm1 keeps precision for small moves; the direct difference handles a weight that underflows.
    upper = ops.where(up < 0.5, a * ops.expm1(up), ops.exp(log_a + up) - a)
    lower = -a * ops.expm1(down)
    delta = ops.minimum(ops.maximum(upper, lower), 1.0)
    delta = ops.where(delta == delta, delta, 1.0)
    delta = delta if vis is None else ops.where(vis, delta, 0.0)
    # The row's log-sum-exp moves by at most max(log Rmax, -log Rmin).
    lse_shift = ops.maximum(log_rmax, -log_rmin)
    return delta, ops.where(lse_shift == lse_shift, lse_shift, 0.0)
