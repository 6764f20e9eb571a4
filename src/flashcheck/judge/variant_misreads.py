"""The variant's mistakes a diagnosis tries on a row: a row's logits as the variant defines them (its cap and
biases in the spec's order) and as kernels get them wrong (each feature's ``misreads``, and an fp8 descale of
q or k ignored or applied twice)."""

from __future__ import annotations

import torch

from ..features.registry import REGISTRY
from ..features.scores import RowTerms
from ..features.variant import Variant
from ..inputs.quantization import misread_scales

__all__ = ["row_biases", "misread_logits"]


def row_biases(variant: Variant, b: int, h: int, i: int, n_q: int, n_k: int) -> dict:
    """The bias of row (b, h, i) of each bias feature the variant uses: name -> (Nk,) float64, in registry
    order."""
    def of(t):  # t: (B or 1, Hq or 1, 1, Nk or 1)
        return t[_at(t, 0, b), _at(t, 1, h), 0].expand(n_k)

    row = torch.tensor([i])
    return {f.name: of(f.bias(variant, n_q, n_k, row, "cpu", False)) for f in variant.biasing()}


def _at(t: torch.Tensor, dim: int, index: int) -> int:
    return index if t.shape[dim] > 1 else 0


def misread_logits(row) -> list[tuple[str, torch.Tensor]]:
    """(what, logits) of the row's variant read wrongly: each feature's misreads (the mistakes kernels make
    with it), and an fp8 descale of q or k ignored or applied twice."""
    v = row.variant
    terms = RowTerms(row.dots, row.scale, row.biases, v.cap, v.bias_order, row.b, row.h, row.i, row.n_q, row.n_k)
    out = [m for f in REGISTRY if getattr(v, f.name) is not None for m in f.misreads(v, terms)]
    # the dots are of the dequantized q and k: a misread scale scales the logits
    out += [(what, terms.logits(scaled=terms.scaled * factor))
            for what, factor in misread_scales(v, row.b, row.h // row.group)]
    return out
