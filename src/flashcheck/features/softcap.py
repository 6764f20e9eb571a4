"""Soft-capping (Gemma 2): ``softcap=c`` makes the scaled logits s ``c * tanh(s / c)``, before the masks hide any
key; ``c = inf`` is no cap. Where a bias meets the cap, the spec's ``bias_order`` says which comes first
(:mod:`flashcheck.features.scores`)."""

from __future__ import annotations

import math
import numbers

import torch

from ..errors import InvalidArgument
from .base import Feature
from .scores import RowTerms, capped_scores, finite_cap

__all__ = ["FEATURE"]


def _check(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and softcap > 0:
        return float(softcap)
    raise InvalidArgument("softcap", softcap, "expected a positive number (math.inf: no cap)",
                          "Pass softcap=30.0, say, or None for no soft-capping.")


def _neutral(variant, causal: str, spec, shapes):
    return ("softcap=inf", variant.replace(softcap=math.inf), causal)


def _misreads(variant, row: RowTerms) -> list:
    cap = finite_cap(row.cap)
    if cap is None:
        return []
    unscaled = capped_scores(row.dots, None, cap, False, torch.tanh)[1]
    out = [("the cap applied to the unscaled logits", unscaled * row.scale + row.bias),
           ("no cap (softcap ignored)", row.logits(cap=None))]
    if variant.biased:
        other = "bias_first" if row.order == "cap_first" else "cap_first"
        out.append((f"cap and bias in the other order ({other})", row.logits(order=other)))
    return out


FEATURE = Feature(
    name="softcap", flag="softcap", term="cap", summary="the scaled logits s become c tanh(s / c)",
    check=_check, text=lambda value: f"{value:g}",
    to_json=lambda value: value if math.isfinite(value) else "inf",
    from_json=lambda value: math.inf if value == "inf" else value,
    # Gemma 2's caps are 50 (attention) and 30 (final logits); 1 saturates every logit.
    regimes={"none": None, "cap_50": lambda gen, s: 50.0, "cap_30": lambda gen, s: 30.0, "cap_1": lambda gen, s: 1.0},
    neutral=_neutral, misreads=_misreads,
    neutral_text="a cap of inf",
    literal=lambda value: repr(value) if math.isfinite(value) else "math.inf",  # a reproducer's script imports math
)
