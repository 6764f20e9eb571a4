"""Where a cap and a bias meet: the one rule every layer applies to a row's logits.

The scaled logits s of a case with a cap c (:mod:`.softcap`) and a bias b (:mod:`.alibi`, :mod:`.attn_bias`)
are ``c tanh(s / c) + b`` where the kernel's spec says ``bias_order="cap_first"`` (flash-attention's) and
``c tanh((s + b) / c)`` where it says ``"bias_first"``; without a cap the bias is simply added. The oracle, the
twin, the references and the diagnoses all compose the logits through :func:`capped_scores`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["RowTerms", "bias_after_cap", "capped_scores", "compose", "finite_cap"]


def finite_cap(softcap) -> float | None:
    """The cap that changes the logits: None for no cap or an infinite one."""
    return None if softcap in (None, math.inf) else softcap


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


def compose(scaled, alibi, bias, cap, order: str):
    """A row's logits (torch) from its scaled ones, its ALiBi and bias terms (None: none) and its cap, in
    ``order``."""
    total = sum(t for t in (alibi, bias) if t is not None)
    return capped_scores(scaled, total, finite_cap(cap), bias_after_cap(True, cap, order), torch.tanh)[1]


@dataclass(frozen=True)
class RowTerms:
    """One row's parts, for the misreads a diagnosis tries (each feature's ``misreads``): its unscaled logits
    ``dots`` (Nk,), the softmax ``scale``, its ALiBi and bias terms (None: none), the cap and the bias order,
    and (b, h, i) with the case's lengths."""

    dots: torch.Tensor
    scale: float
    alibi: torch.Tensor | None
    bias: torch.Tensor | None
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

    def logits(self, *, scaled=None, alibi=..., bias=..., cap=..., order=None) -> torch.Tensor:
        """The row's logits with the parts given changed (``...``: as they are)."""
        return compose(self.scaled if scaled is None else scaled, self.alibi if alibi is ... else alibi,
                       self.bias if bias is ... else bias, self.cap if cap is ... else cap, order or self.order)
