"""The float64 oracle's bound checked against mpmath (:func:`audit_reference`): the auditor's verdict on
the certified bound, element by element, forward (the backward's is :func:`.gradients.audit_gradients`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ..features.variant import Variant
from .oracle import reference_attention

__all__ = ["Audit", "audit_reference"]


@dataclass
class Audit:
    """The float64 oracle checked against mpmath on some rows.

    ``worst_ratio`` is the largest |out64 - out_mp| / (bound64 + rounding of out_mp) over every element
    audited; the float64 bound holds when it is at most 1. Likewise ``lse_worst_ratio``.
    """

    worst_ratio: float
    worst_index: tuple
    lse_worst_ratio: float
    elements: int
    empty_rows_agree: bool

    @property
    def ok(self) -> bool:
        return self.empty_rows_agree and self.worst_ratio <= 1.0 and self.lse_worst_ratio <= 1.0


def audit_reference(q, k, v, *, scale: float, causal: str = "none", attn_mask=None,
                    rows: Sequence[int] | None = None, dps: int = 50, variant: Variant | None = None) -> Audit:
    """Check the float64 oracle's bound against mpmath on ``rows`` (default: every row)."""
    kw = dict(scale=scale, causal=causal, attn_mask=attn_mask, rows=rows, variant=variant)
    fast = reference_attention(q, k, v, method="float64", **kw)
    slow = reference_attention(q, k, v, method="mpmath", dps=dps, **kw)
    fast_out, fast_bound = fast.out.cpu(), fast.bound.cpu()
    live = ~slow.empty_rows.cpu()
    agree = bool(torch.equal(fast.empty_rows.cpu(), slow.empty_rows.cpu()))
    err = (fast_out - slow.out).abs()
    allowed = fast_bound + slow.bound
    ratio = torch.where(live[..., None], err / allowed, torch.zeros_like(err))
    ratio = torch.where(err == 0, torch.zeros_like(ratio), ratio)  # 0/0 on exact answers
    flat_index = int(torch.argmax(torch.nan_to_num(ratio, nan=math.inf, posinf=math.inf)))
    worst = tuple(int(i) for i in np.unravel_index(flat_index, ratio.shape))
    lse_err = (fast.lse.cpu() - slow.lse).abs()
    lse_ratio = torch.where(live, lse_err / (fast.lse_bound.cpu() + slow.lse_bound), torch.zeros_like(lse_err))
    lse_ratio = torch.where(lse_err == 0, torch.zeros_like(lse_ratio), lse_ratio)
    return Audit(worst_ratio=float(torch.nan_to_num(ratio, nan=math.inf, posinf=math.inf).max()),
                 worst_index=worst,
                 lse_worst_ratio=float(torch.nan_to_num(lse_ratio, nan=math.inf, posinf=math.inf).max()),
                 elements=int(live.sum()) * ratio.shape[-1],
                 empty_rows_agree=agree)
