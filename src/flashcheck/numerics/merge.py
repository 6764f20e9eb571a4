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
gamma_{2S})) for the sum's relative error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..contract.formats import FORMATS, format_of

__all__ = ["MergeBudget", "merge_budget", "merge_reference"]

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


def merge_budget(outs: torch.Tensor, lses: torch.Tensor, *, dtype, exp_ulps: float = 2.0) -> MergeBudget:
    """The budget of merging ``outs`` (S, R, Dv) and natural-log ``lses`` (S, R) into ``dtype`` (see the
    module's contract)."""
    out, lse, empty = merge_reference(outs, lses)
    fmt = format_of(dtype)
    o, l = outs.double(), lses.double()
    m = torch.where(empty, 0.0, l.amax(0))
    w = torch.exp(l - m)
    live = torch.isfinite(l)
    dist = torch.where(live, (l - m).abs(), 0.0)
    theta = 2 * U32 * (torch.where(live, l.abs(), 0.0) + m.abs() + dist)
    e = torch.where(live, w * (torch.expm1(theta) + torch.exp(theta) * exp_ulps * U32) + FP32_TINY, 0.0)
    total = w.sum(0)
    g = _gamma(2 * outs.shape[0] + 2, U32)
    shift = (e[..., None] * torch.where(live[..., None], (o - out).abs(), 0.0)).sum(0)
    sums = g * ((w[..., None] * torch.where(live[..., None], o.abs(), 0.0)).sum(0) + out.abs() * total[..., None])
    floor = torch.clamp(total - e.sum(0), min=0.0)[..., None]
    moved = torch.where(floor > 0, (shift + sums) / torch.where(floor > 0, floor, 1.0), math.inf)
    out_tol = moved + (2 * U32 + fmt.unit_roundoff) * out.abs() + fmt.subnormal_spacing
    rel = e.sum(0) / torch.where(empty, 1.0, total) + g
    sum_error = torch.where(rel < 1, -torch.log1p(-torch.clamp(rel, max=1 - 2.0**-40)), math.inf)
    lse_tol = 3 * U32 * (lse.abs() + m.abs()) + sum_error
    return MergeBudget(out, lse, empty, torch.where(empty[..., None], 0.0, out_tol),
                       torch.where(empty, 0.0, lse_tol))
