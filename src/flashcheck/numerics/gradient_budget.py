"""The backward pass's error budget: how far a legal backward kernel's dQ, dK and dV may sit from the
exact gradients, element by element (docs/design.md, "The backward model").

The kernel model: FA2-style recomputation, as Triton's and flash-attention's backward kernels do it,
under the forward's precision contract (:func:`flashcheck.numerics.budget.contract_terms`):

- P~_ij = exp(S~_ij - lse~_i): the logits carry the forward's per-key error eta_ij, the saved lse the
  forward budget's lse tolerance eps_i, and exp its ulps, so |P~ - a| <= e_ij = a_ij (e^(eta_ij + eps_i)
  (1 + c u_32) - 1).
- dV = P_t^T dO with P rounded to P's dtype (u_p), accumulated in fp32 over the G Nq rows.
- dP~ = dO V^T in fp32 over Dv; D~_i = dO_i . O_t_i with the kernel's own forward output, which sits
  within the forward budget tol(O) of the exact one. So |dP~ - D~| <= X_ij = |dP_ij - D_i| + g A_ij + err D_i.
- dS~ = P~ (dP~ - D~) in fp32, rounded to P's dtype (u_ds) before the two matmuls:
  |dS~ - dS| <= e_ij X_ij + a_ij (g A_ij + err D_i) + u' (a_ij + e_ij) X_ij.
- dQ = scale dS_t K and dK = scale dS_t^T Q, accumulated in fp32 over Nk and G Nq, tf32 operands for
  fp32 where the contract says so, then rounded to the output dtype; with GQA, dK and dV are summed
  over the group, in the inputs' dtype at worst (each head's share rounded first: near zero, an
  absolute error of half the subnormal spacing per rounding).

Each gradient's budget has the terms ``recompute`` (the recomputed P's error carried through), ``products``
(dP, D, dS's rounding and the accumulations), ``output_rounding`` and ``oracle``. Rows whose dS cancels
(one visible key, dO along O) get exactly the rounding noise of those terms and nothing relative to a
vanishing |dQ|.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..contract.formats import format_of
from ..contract.precision import Precision, precision_named
from ..contract.validation import check_attention_inputs
from ..features.variant import Variant
from .blockwise import add_into, ops_for
from .budget import (
    FP32_TINY,
    LOGIT_ULPS,
    BudgetModel,
    budget_block,
    contract_terms,
    logit_error,
    lse_tolerance,
    raw_logit_error,
)
from .gradients import GRADIENTS, Gradients, check_upstream, float64_gradients, group_rows
from .variant_gradients import Reductions

__all__ = ["GradientBudget", "gradient_budget", "GRADIENT_TERMS"]

GRADIENT_TERMS = ("recompute", "products", "output_rounding", "oracle")


def _gamma(n: float, u: float) -> float:
    return n * u / (1 - n * u)


@dataclass
class GradientBudget:
    """Per-element tolerances of dQ, dK and dV (``total[name]``, and ``terms[name][term]``), float64
    tensors of each gradient's shape, with the oracle's gradients in ``gradients``."""

    total: dict[str, torch.Tensor]
    terms: dict[str, dict[str, torch.Tensor]]
    gradients: Gradients
    precision: Precision

    def breakdown(self, name: str, index: tuple) -> dict[str, float]:
        out = {term: float(t[index]) for term, t in self.terms[name].items()}
        out["total"] = float(self.total[name][index])
        return out


@dataclass
class _Factors:
    """The per-call roundoffs of the backward model."""

    model: BudgetModel
    u_ds: float  # dS rounded before its matmuls (like P)
    g_dp: float  # dP and D: fp32 over Dv, tf32 operands
    g_q: float   # dQ: fp32 over Nk (with tile rescales), tf32 operands, the scale multiply
    g_kv: float  # dK, dV: fp32 over the G Nq rows, tf32 operands, the scale multiply
    g_group: float  # GQA: the group's sum in the inputs' dtype
    exp_rel: float  # exp's rounding on P~
    u_o: float
    s_o: float
    group: int  # query heads per K/V head
    flushed: dict  # per gradient: products of its fp32 sums that may be flushed to zero, times FP32_TINY

    @classmethod
    def of(cls, model: BudgetModel, shapes) -> "_Factors":
        t = model.terms
        u, tf = t.u_32, (1 + t.u_in) ** 2 - 1
        return cls(model=model, u_ds=t.u_p, g_dp=_gamma(shapes.head_dim_v, u) + tf,
                   g_q=_gamma(model.accumulation_len + 1, u) + tf,
                   g_kv=_gamma(shapes.group * shapes.n_q + 2, u) + tf,
                   g_group=_gamma(shapes.group - 1, t.u_o) if shapes.group > 1 else 0.0,
                   exp_rel=(t.exp_ulps + LOGIT_ULPS) * u, u_o=t.u_o, s_o=t.s_o, group=shapes.group,
                   flushed=_flushed(model, shapes))


def _flushed(model: BudgetModel, shapes) -> dict:
    """Each gradient's fp32 sums may flush a product below fp32's smallest normal to zero (tensor cores do),
    losing up to FP32_TINY per product: measured on an H200, dV of fp32 rows whose sink takes nearly all
    the weight (P near e^-50, dO near O) came out 0 where the exact dV is 3e-44."""
    kv = (shapes.group * shapes.n_q + 2) * FP32_TINY
    return {"dq": (model.accumulation_len + 1) * FP32_TINY * max(1.0, abs(model.scale)),
            "dk": kv * max(1.0, abs(model.scale)), "dv": kv}


def gradient_budget(q, k, v, do, *, scale: float, causal: str = "none", attn_mask=None,
                    precision: Precision | str = "flash", variant: Variant | None = None) -> GradientBudget:
    """The per-element budget of dQ, dK and dV for a backward kernel honouring ``precision`` on this
    input (and ``variant``) and upstream gradient; one walk over the scores gives the oracle's gradients
    and the budget."""
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    do = check_upstream(do, q, shapes)
    precision = precision_named(precision)
    variant = Variant() if variant is None else variant
    model = BudgetModel(shapes, scale, precision, contract_terms(precision, q.dtype), sink=variant.sink is not None,
                        keys=variant.summed_keys(shapes.n_k))
    f = _Factors.of(model, shapes)
    ops = ops_for(q.device)
    acc = _TermSums(shapes, q.device)
    extra = _VariantTerms(Reductions(variant, shapes, q.device, ("recompute", "products", "size")))

    def on_block(blk, fwd, bg):
        acc.add(ops, blk, _block_terms(ops, blk, fwd, bg, scale, f, extra))

    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        grads = float64_gradients(q, k, v, do, scale, causal, attn_mask, shapes, extra_on_block=on_block,
                                  variant=variant)
    budget = acc.budget(grads, f, precision)
    extra.into(budget, grads, model)
    return budget


def _block_terms(ops, blk, fwd, bg, scale: float, f: _Factors, extra: "_VariantTerms"):
    """{gradient: (recompute, products)} of one block (dK and dV: this block's rows' share)."""
    sm, model = fwd.softmax, f.model
    eta = logit_error(ops, blk, sm, model)
    output_rounding, logit, accumulation, subnormal_p, _, lse_shift = budget_block(
        ops, blk, sm, fwd.out, fwd.w, model, eta=eta)
    tol_O = output_rounding + logit + accumulation + subnormal_p + fwd.bound
    lse = sm.m + ops.log(sm.l)
    eps = lse_tolerance(lse_shift, ops.abs(lse), 0.0, model) * (1 + 2.0**-20)
    dO = bg.dO
    a = bg.weights + bg.E  # an upper bound of the exact weights
    theta = eta + eps
    # |P~ - a|: relative from the logits and the lse, absolute where fp32's exp underflows or flushes to 0.
    e = a * (ops.expm1(theta) + ops.exp(theta) * f.exp_rel) + FP32_TINY
    e = e if blk.vis is None else ops.where(blk.vis, e, 0.0)
    # dS~ in fp32 may flush to zero, and dS rounded to P's dtype near zero is absolute (visible keys only:
    # a masked key's P is exactly 0, and so is its dS).
    near_zero = FP32_TINY + model.terms.s_p
    near_zero = near_zero if blk.vis is None else ops.float64(blk.vis) * near_zero
    abs_dO = ops.abs(dO)
    err_D = ops.sum(abs_dO * tol_O, -1) + f.g_dp * ops.sum(abs_dO * (ops.abs(fwd.out) + tol_O), -1) + bg.err_D
    X = ops.abs(bg.dP - bg.D) + f.g_dp * bg.A + err_D  # |dP~ - D~|
    u1 = 2 * model.terms.u_32 + f.u_ds
    recompute_ds = e * X * (1 + u1)
    products_ds = a * (f.g_dp * bg.A + err_D) + u1 * a * X + near_zero
    ds_size = (a + e) * X * (1 + u1)  # |dS_t|
    at_logits = {"recompute": recompute_ds, "products": products_ds, "size": ds_size}
    if blk.cap is not None:
        recompute_ds, products_ds, ds_size = _through_the_cap(ops, blk, sm, model, recompute_ds, products_ds, ds_size)
    extra.add_block(ops, blk, at_logits, {"recompute": recompute_ds, "products": products_ds, "size": ds_size})
    products_ds = products_ds + bg.err_dS
    absK, absQ = ops.abs(blk.K), ops.abs(blk.Q)
    sc = abs(scale)
    rows, t = group_rows, (lambda x: ops.swap(group_rows(x)))
    g_k = f.g_kv + f.g_group
    dq = (sc * ops.matmul(recompute_ds, absK), sc * ops.matmul(products_ds + f.g_q * ds_size, absK))
    dk = (sc * ops.matmul(t(recompute_ds), rows(absQ)), sc * ops.matmul(t(products_ds + g_k * ds_size), rows(absQ)))
    u_p = model.terms.u_p
    p_size = (a + e) * (1 + u_p)
    dv = (ops.matmul(t(e * (1 + u_p)), rows(abs_dO)),
          ops.matmul(t(u_p * a + bg.E + (f.g_kv + f.g_group) * p_size + near_zero), rows(abs_dO)))
    if blk.sink is not None:  # the sink's key is no input: its dK and dV rows go
        n_k = blk.K.shape[-2] - 1
        dk, dv = (tuple(x[..., :n_k, :] for x in pair) for pair in (dk, dv))
    return {"dq": dq, "dk": dk, "dv": dv}


def _through_the_cap(ops, blk, sm, model: BudgetModel, recompute_ds, products_ds, ds_size):
    """The dS terms carried back through the cap: a legal kernel's slope 1 - t^2 is off by at most
    2 |dt| + 3 u, with dt from its scaled logit's error (through tanh' <= 1, over c) and its tanh's."""
    c = blk.cap
    eta_raw, _ = raw_logit_error(ops, blk, sm, model)
    t = ops.tanh(sm.raw / c)
    slope = 1.0 - t * t
    slope_err = 2 * (eta_raw / c + model.precision.tanh_error + model.terms.u_32) + 3 * model.terms.u_32
    if blk.sink is not None:  # the sink is no logit of Q and K: nothing to carry back
        zero = 0 * slope[..., :1]
        slope, slope_err = ops.concat((slope[..., :-1], zero + 1.0), -1), ops.concat((slope_err[..., :-1], zero), -1)
    top = ops.minimum(slope + slope_err, 1.0) * (1 + model.terms.u_32)
    return (top * recompute_ds + slope_err * ds_size, top * products_ds + model.terms.u_32 * top * ds_size,
            top * ds_size)


class _VariantTerms:
    """The budget of the variant gradients: a legal kernel's dS terms where the bias enters (or at the sink's
    column), summed as the tensor broadcasts, in fp32 (each product may flush), rounded to the tensor's dtype."""

    def __init__(self, sums: Reductions):
        self.sums = sums

    def add_block(self, ops, blk, at_logits: dict, at_cap_input: dict) -> None:
        for name in self.sums.names:
            self.sums.add(ops, blk, name, {n: self.sums.share(blk, name, at_logits[n], at_cap_input[n])
                                           for n in at_logits})

    def into(self, budget: GradientBudget, grads: Gradients, model: BudgetModel) -> None:
        u = model.terms.u_32
        for name in self.sums.names:
            n = self.sums.terms(name)
            fmt = format_of(self.sums.tensor(name).dtype)
            recompute = self.sums.reduced(name, "recompute")
            products = (self.sums.reduced(name, "products") + _gamma(n + 1, u) * self.sums.reduced(name, "size")
                        + n * FP32_TINY)
            exact = grads[name].abs() + grads.bound[name]
            rounding = fmt.unit_roundoff * (exact + recompute + products) + fmt.subnormal_spacing / 2
            terms = {"recompute": recompute, "products": products, "output_rounding": rounding,
                     "oracle": grads.bound[name]}
            budget.terms[name] = terms
            budget.total[name] = sum(terms[t] for t in GRADIENT_TERMS) * (1 + 2.0**-16)


class _TermSums:
    """The budget's recompute and products terms per gradient, summed over blocks."""

    def __init__(self, shapes, device):
        P, G = shapes.batch * shapes.heads_kv, shapes.group
        z = lambda *s: torch.zeros(s, dtype=torch.float64, device=device)  # noqa: E731
        self.shapes = shapes
        self.sums = {"dq": [z(P, G, shapes.n_q, shapes.head_dim) for _ in range(2)],
                     "dk": [z(P, shapes.n_k, shapes.head_dim) for _ in range(2)],
                     "dv": [z(P, shapes.n_k, shapes.head_dim_v) for _ in range(2)]}

    def add(self, ops, blk, block_terms: dict) -> None:
        for name, values in block_terms.items():
            index = (blk.heads, slice(None), blk.sl) if name == "dq" else (blk.heads,)
            for target, value in zip(self.sums[name], values):
                add_into(ops, target, index, value)

    def budget(self, grads: Gradients, f: _Factors, precision: Precision) -> GradientBudget:
        terms, total = {}, {}
        for name in GRADIENTS:
            shape = grads[name].shape
            recompute, products = (t.reshape(shape) for t in self.sums[name])
            exact = grads[name].abs() + grads.bound[name]
            # dK and dV with GQA: each query head's share may be rounded to the dtype before the group's
            # sum, and near zero each rounding is absolute (s_o), as are the sums that follow.
            roundings = 1 if name == "dq" else 2 * f.group - 1
            products = products + f.flushed[name]
            rounding = f.u_o * (exact + recompute + products) + roundings * f.s_o
            terms[name] = {"recompute": recompute, "products": products, "output_rounding": rounding,
                           "oracle": grads.bound[name]}
            total[name] = sum(terms[name][t] for t in GRADIENT_TERMS) * (1 + 2.0**-16)
        return GradientBudget(total=total, terms=terms, gradients=grads, precision=precision)
