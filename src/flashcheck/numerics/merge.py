"""The merge of split-KV partial states: its float64 oracle and the budget of a legal fp32 merge.

Split-KV decoding runs attention over S blocks of keys apart; split s gives a partial output o_s (a row of
Dv values) and its log-sum-exp lse_s (-inf for a split that saw no key). The merged row is exact in real
arithmetic: M = max_s lse_s, w_s = e^(lse_s - M), L = sum_s w_s, out = sum_s w_s o_s / L, lse = M + ln L;
a row whose splits are all empty has out = 0 and no finite lse.

**The contract of a legal merge**: fp32 arithmetic, the weights taken relative to the largest lse (in
natural log or base 2, a constant's rounding apart), the sums in any order or pairwise (one two-way merge
after another), the output rounded once to its dtype at the end. Its budget, per element:

- the weights: each w~_s is off by e_s = w_s (expm1(theta_s) + e^theta_s exp_err) + FP32_TINY, where
  theta_s = 2u (|lse_s| + |M| + |lse_s - M|) bounds the exponent's error (the differences and a base-2
  conversion of both lse, each rounded) and exp_err = exp_ulps u the exponential's own;
- moving weight between splits moves the output by at most sum_s e_s |o_s - out| / (L - sum_s e_s)
  (sum_s w_s (o_s - out) = 0);
- the fp32 sums and the pairwise renormalisations: gamma_{2S} (sum_s w_s |o_s| + |out| L) / (L - sum e);
- the division and the final rounding: (2u + u_dtype) |out| plus the dtype's subnormal spacing.

The lse's budget: 3u (|lse| + |M|) for the additions and a base-2 conversion, and -log1p(-(sum e / L +
gamma_{2S})) for the sum's relative error. (Computed with shares w_s / L, L >= 1: FP32_TINY / L <= FP32_TINY.)

**The fold** (:func:`fold_budget`): a two-state merge called S - 1 times, ((s1 + s2) + s3) + ..., each call a
legal merge of two whose out is rounded to the dtype and whose lse is fp32 before the next call. Let the prefix
merged so far be exactly (a, la) and computed within D (elementwise) and E of it, and the next state (b, lb),
merged exactly into (out, lse), with shares alpha = e^(la - lse) and 1 - alpha. Then:

- the exact merge of the computed prefix moves from out by at most min(1, alpha e^E) D + expm1(E) e^E alpha
  |a - out| (its weight is off by a factor e^(+-E); f(x) = (x a + B b) / (x + B) gives f(A') - f(A) =
  (A' - A) B (a - b) / ((A' + B)(A + B))), and its lse by -log1p(-alpha expm1(E));
- the call's own error is the two-state budget above at the inputs it got: every bound there is monotone in
  |o_s|, |o_s - out|, |out|, |lse|, |M|, theta_s and the shares, so it is evaluated at the exact inputs widened
  by D and E (theta_s + 8u E, shares times e^E).

D and E after the call are the two sums; the budget is D and E after the last call. One call (S = 2) is the
two-state budget exactly; each further call adds a rounding to the dtype, weighted by its prefix's share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..contract.formats import FORMATS, format_of

__all__ = ["MergeBudget", "fold_budget", "merge_budget", "merge_reference"]

U32 = FORMATS["fp32"].unit_roundoff
FP32_TINY = FORMATS["fp32"].smallest_normal


def _gamma(n: float, u: float) -> float:
    return n * u / (1 - n * u)


def merge_reference(outs: torch.Tensor, lses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out, lse, empty) of merging ``outs`` (S, R, Dv) with their natural-log ``lses`` (S, R), in float64:
    ``empty`` marks the rows with no finite lse, whose out is 0 and lse -inf."""
    o, l = outs.double(), lses.double()
    m = l.amax(0)
    empty = m == -math.inf
    safe = torch.where(empty, 0.0, m)
    w = torch.exp(l - safe)  # e^-inf = 0 for an empty split
    total = w.sum(0)
    out = (w[..., None] * torch.where(w[..., None] > 0, o, 0.0)).sum(0) / torch.where(empty, 1.0, total)[..., None]
    lse = torch.where(empty, -math.inf, safe + torch.log(torch.where(empty, 1.0, total)))
    return torch.where(empty[..., None], 0.0, out), lse, empty


@dataclass
class MergeBudget:
    """The oracle's merge and a legal fp32 merge's budget: ``out`` (R, Dv), ``lse`` (R,), float64, with their
    tolerances ``out_tol`` and ``lse_tol``, and the rows with no finite lse (``empty``)."""

    out: torch.Tensor
    lse: torch.Tensor
    empty: torch.Tensor
    out_tol: torch.Tensor
    lse_tol: torch.Tensor


def _shares(lses: torch.Tensor, lse: torch.Tensor, empty: torch.Tensor) -> torch.Tensor:
    """Each state's share e^(lse_s - lse) of the merged sum (0 for an empty state, and on an empty row)."""
    return torch.where(empty, 0.0, torch.exp(lses - torch.where(empty, 0.0, lse)))


def _theta(lses: torch.Tensor, m: torch.Tensor, live: torch.Tensor) -> torch.Tensor:
    """Each weight's exponent error: the differences to the max and a base-2 conversion of both lse, rounded."""
    return 2 * U32 * (torch.where(live, lses.abs() + (lses - m).abs(), 0.0) + m.abs())


@dataclass(frozen=True)
class StateBounds:
    """Bounds on a merge's S states and its result, from which a legal merge's tolerances follow: each state's
    ``share`` of the merged sum (w_s / L) and ``theta`` its exponent's error, (S, R), with ``live`` its finite
    lse; ``o_abs`` |o_s| and ``dev_abs`` |o_s - out|, (S, R, Dv); ``out_abs`` |out| (R, Dv); ``lse_abs`` |lse|
    and ``m_abs`` |M|, (R,)."""

    share: torch.Tensor
    theta: torch.Tensor
    live: torch.Tensor
    o_abs: torch.Tensor
    dev_abs: torch.Tensor
    out_abs: torch.Tensor
    lse_abs: torch.Tensor
    m_abs: torch.Tensor


def _tolerances(b: StateBounds, *, g: float, fmt, exp_ulps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out_tol, lse_tol) of a legal merge whose sums have error factor ``g``, its out rounded to ``fmt``. The
    weight errors e_s / L <= share_s (expm1(theta_s) + e^theta_s exp_err) + FP32_TINY (L >= 1: the largest
    weight is e^0)."""
    live = b.live
    rho = torch.where(live, b.share * (torch.expm1(b.theta) + torch.exp(b.theta) * exp_ulps * U32) + FP32_TINY, 0.0)
    floor = (1 - rho.sum(0))[..., None]
    shift = (rho[..., None] * torch.where(live[..., None], b.dev_abs, 0.0)).sum(0)
    sums = g * ((b.share[..., None] * torch.where(live[..., None], b.o_abs, 0.0)).sum(0) + b.out_abs)
    moved = torch.where(floor > 0, (shift + sums) / torch.where(floor > 0, floor, 1.0), math.inf)
    out_tol = moved + (2 * U32 + fmt.unit_roundoff) * b.out_abs + fmt.subnormal_spacing
    rel = rho.sum(0) + g
    sum_error = torch.where(rel < 1, -torch.log1p(-torch.clamp(rel, max=1 - 2.0**-40)), math.inf)
    return out_tol, 3 * U32 * (b.lse_abs + b.m_abs) + sum_error


def merge_budget(outs: torch.Tensor, lses: torch.Tensor, *, dtype, exp_ulps: float = 2.0) -> MergeBudget:
    """The budget of merging ``outs`` (S, R, Dv) and natural-log ``lses`` (S, R) into ``dtype`` (see the
    module's contract)."""
    out, lse, empty = merge_reference(outs, lses)
    o, l = outs.double(), lses.double()
    m = torch.where(empty, 0.0, l.amax(0))
    live = torch.isfinite(l)
    bounds = StateBounds(_shares(l, lse, empty), _theta(l, m, live), live, o.abs(), (o - out).abs(), out.abs(),
                         torch.where(empty, 0.0, lse.abs()), m.abs())
    out_tol, lse_tol = _tolerances(bounds, g=_gamma(2 * outs.shape[0] + 2, U32), fmt=format_of(dtype),
                                   exp_ulps=exp_ulps)
    return MergeBudget(out, lse, empty, torch.where(empty[..., None], 0.0, out_tol), torch.where(empty, 0.0, lse_tol))


@dataclass(frozen=True)
class State:
    """A partial state, or the merge of several: its out (R, Dv) and natural-log lse (R,), float64."""

    out: torch.Tensor
    lse: torch.Tensor


@dataclass(frozen=True)
class Deviation:
    """How far the fold's computed prefix may sit from its exact merge: D on out (R, Dv), E on lse (R,)."""

    out: torch.Tensor
    lse: torch.Tensor


def fold_budget(outs: torch.Tensor, lses: torch.Tensor, *, dtype, exp_ulps: float = 2.0) -> MergeBudget:
    """The budget of folding the states with a legal two-state merge, ((s1 + s2) + s3) + ..., each merge's out
    rounded to ``dtype`` and its lse to fp32 before the next (see the module's contract: the fold)."""
    o, l = outs.double(), lses.double()
    fmt = format_of(dtype)
    prefix = State(o[0], l[0])
    error = Deviation(torch.zeros_like(prefix.out), torch.zeros_like(prefix.lse))
    for b, lb in zip(o[1:], l[1:]):
        prefix, error = _fold_step(prefix, error, State(b, lb), fmt, exp_ulps)
    out, lse, empty = merge_reference(outs, lses)
    return MergeBudget(out, lse, empty, torch.where(empty[..., None], 0.0, error.out),
                       torch.where(empty, 0.0, error.lse))


def _fold_step(prefix: State, error: Deviation, state: State, fmt, exp_ulps: float) -> tuple[State, Deviation]:
    """The exact merge of the prefix with the next ``state``, and (D, E) after the call that merges the prefix as
    computed, within ``error`` of it."""
    a, la, b, lb, err, lse_err = prefix.out, prefix.lse, state.out, state.lse, error.out, error.lse
    out, lse, empty = merge_reference(torch.stack([a, b]), torch.stack([la, lb]))
    ls = torch.stack([la, lb])
    alpha, beta = _shares(ls, lse, empty)  # the prefix's share of the merged sum, and the state's
    grow, spread = torch.exp(lse_err), torch.expm1(lse_err)
    # The exact merge of the computed prefix against the exact merge: its out moves the prefix's error, and
    # its weight off by e^E moves the out along a - out; its lse moves by log(1 + alpha (e^E - 1)).
    moved = (torch.clamp(alpha * grow, max=1.0)[..., None] * err
             + (spread * grow * alpha)[..., None] * (a - out).abs())
    tilt = alpha * spread
    lse_moved = torch.where(tilt < 1, -torch.log1p(-torch.clamp(tilt, max=1 - 2.0**-40)), math.inf)
    # The merge's own error on the computed inputs: its bound at the exact inputs, each bound widened by D and E.
    live = torch.isfinite(ls)
    m = torch.where(empty, 0.0, ls.amax(0))
    share = torch.clamp(torch.stack([alpha, beta]) * grow, max=1.0)
    theta = _theta(ls, m, live) + 8 * U32 * lse_err
    o_abs = torch.stack([a.abs() + err, b.abs()])
    dev = torch.stack([(a - out).abs() + err, (b - out).abs()]) + moved
    bounds = StateBounds(share, theta, live, o_abs, dev, out.abs() + moved,
                         torch.where(empty, 0.0, lse.abs()) + lse_moved, m.abs() + lse_err)
    own, own_lse = _tolerances(bounds, g=_gamma(6, U32), fmt=fmt, exp_ulps=exp_ulps)
    return State(out, lse), Deviation(torch.where(empty[..., None], 0.0, moved + own),
                                      torch.where(empty, 0.0, lse_moved + own_lse))
