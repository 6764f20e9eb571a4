"""Where a cap and a bias meet: the one rule every layer applies to a row's logits.

The scaled logits s of a case with a cap c (a "cap" feature) and a bias b (every "bias" feature's, summed)
are ``c tanh(s / c) + b`` where the kernel's spec says ``bias_order="cap_first"`` (flash-attention's) and
``c tanh((s + b) / c)`` where it says ``"bias_first"``; without a cap the bias is simply added. The oracle, the
twin, the references and the diagnoses all compose the logits through :func:`capped_scores`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["RowTerms", "bias_after_cap", "capped_scores", "compose", "finite_cap"]


def finite_cap(cap) -> float | None:
    """The cap that changes the logits: None for no cap or an infinite one."""
    return None if cap in (None, math.inf) else cap


def bias_after_cap(has_bias: bool, cap, bias_order: str) -> bool:
    """Whether the bias is added to the capped logits (else it goes into the cap, or there is no cap)."""
    return has_bias and finite_cap(cap) is not None and bias_order == "cap_first"


def capped_scores(s, bias, cap, late: bool, tanh):
    """(raw, out): the cap's input (``s`` with the bias where it goes first) and the logits as the case has them,
    ``bias`` None for none, ``cap`` None for none, ``late`` from :func:`bias_after_cap`, ``tanh`` the array
    library's own."""
    raw = s + bias if bias is not None and not late else s
    out = raw if cap is None else cap * tanh(raw / cap)
    return raw, (out + bias if late else out)


def compose(scaled, biases, cap, order: str):
    """A row's logits (torch) from its scaled ones, its bias terms (an iterable, None: none, summed in its
    order) and its cap, in ``order``."""
    total = sum(t for t in biases if t is not None)
    return capped_scores(scaled, total, finite_cap(cap), bias_after_cap(True, cap, order), torch.tanh)[1]


@dataclass(frozen=True)
class RowTerms:
    """One row's parts, for the misreads a diagnosis tries (each feature's ``misreads``): its unscaled logits
    ``dots`` (Nk,), the softmax ``scale``, the bias of each bias feature the case uses (``biases``: name ->
    (Nk,) float64, in registry order), the cap and the bias order, and (b, h, i) with the case's lengths."""

    dots: torch.Tensor
    scale: float
    biases: dict
    cap: float | None
    order: str
    b: int
    h: int
    i: int
    n_q: int
    n_k: int

    @property
    def scaled(self) -> torch.Tensor:
        return self.dots * self.scale

    @property
    def bias(self):
        """Every bias summed (0 without one)."""
        return sum(t for t in self.biases.values() if t is not None)

    def logits(self, *, scaled=None, biases=None, cap=..., order=None) -> torch.Tensor:
        """The row's logits with the parts given changed (``biases``: name -> a feature's bias in place of its
        own, None to drop it; ``...``: as they are)."""
        return compose(self.scaled if scaled is None else scaled, {**self.biases, **(biases or {})}.values(),
                       self.cap if cap is ... else cap, order or self.order)
