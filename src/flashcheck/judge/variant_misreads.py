"""The variant's mistakes a diagnosis tries on a row: a row's logits as the variant defines them (cap, ALiBi
and bias in the spec's order) and as kernels get them wrong (the cap on the unscaled logits, no cap, cap and
bias swapped, ALiBi ignored, negated, one key off or aligned top-left, the bias ignored or scaled, an fp8
descale of q or k ignored or applied twice)."""

from __future__ import annotations

import torch

from ..features.registry import REGISTRY
from ..features.scores import RowTerms
from ..features.variant import Variant

__all__ = ["row_biases", "misread_logits"]


def row_biases(variant: Variant, b: int, h: int, i: int, n_q: int, n_k: int):
    """(ALiBi, attn_bias) of row (b, h, i), each (Nk,) float64 or None."""
    def of(t):  # t: (B or 1, Hq or 1, 1, Nk or 1)
        return None if t is None else t[_at(t, 0, b), _at(t, 1, h), 0].expand(n_k)

    row = torch.tensor([i])
    only = Variant(alibi_slopes=variant.alibi_slopes, alibi=variant.alibi)
    return of(only.bias(n_q, n_k, row, "cpu")), of(Variant(attn_bias=variant.attn_bias).bias(n_q, n_k, row, "cpu"))


def _at(t: torch.Tensor, dim: int, index: int) -> int:
    return index if t.shape[dim] > 1 else 0


def misread_logits(row) -> list[tuple[str, torch.Tensor]]:
    """(what, logits) of the row's variant read wrongly: each feature's misreads (the cap, ALiBi and bias
    mistakes kernels make), and an fp8 descale of q or k ignored or applied twice."""
    v = row.variant
    terms = RowTerms(row.dots, row.scale, row.alibi, row.bias, v.softcap, v.bias_order, row.b, row.h, row.i,
                     row.n_q, row.n_k)
    out = [m for f in REGISTRY if getattr(v, f.name) is not None for m in f.misreads(v, terms)]
    if v.descales is not None:  # the dots are of the dequantized q and k
        qd, kd = (float(d) for d in v.descales[:2, row.b, row.h // row.group])
        out += [(f"{name} {how} (fp8)", terms.logits(scaled=terms.scaled * factor))
                for name, d in (("q_descale", qd), ("k_descale", kd))
                for how, factor in (("ignored", 1 / d), ("applied twice", d)) if d != 1.0]
    return out
