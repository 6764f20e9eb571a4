"""The variant's mistakes a diagnosis tries on a row: a row's logits as the variant defines them (cap, ALiBi
and bias in the spec's order) and as kernels get them wrong (the cap on the unscaled logits, no cap, cap and
bias swapped, ALiBi ignored, negated, one key off or aligned top-left, the bias ignored or scaled, an fp8
descale of q or k ignored or applied twice)."""

from __future__ import annotations

import torch

from ..features.scores import bias_after_cap, capped_scores, finite_cap
from ..features.variant import Variant

__all__ = ["capped", "compose", "row_biases", "misread_logits"]


def capped(scores: torch.Tensor, softcap) -> torch.Tensor:
    return capped_scores(scores, None, finite_cap(softcap), False, torch.tanh)[1]


def compose(scaled, alibi, bias, softcap, order: str):
    """A row's logits from its scaled ones, its ALiBi and bias terms (None: none) and its cap, in ``order``."""
    total = sum(t for t in (alibi, bias) if t is not None)
    late = bias_after_cap(True, softcap, order)
    return capped_scores(scaled, total, finite_cap(softcap), late, torch.tanh)[1]


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
    """(what, logits) of the row's variant read wrongly: the cap, ALiBi and bias mistakes kernels make."""
    v, scaled = row.variant, row.dots * row.scale
    cap, order, alibi, bias = v.softcap, v.bias_order, row.alibi, row.bias
    out = []
    if finite_cap(cap) is not None:
        biases = sum(t for t in (alibi, bias) if t is not None)
        out += [("the cap applied to the unscaled logits", capped(row.dots, cap) * row.scale + biases),
                ("no cap (softcap ignored)", compose(scaled, alibi, bias, None, order))]
        if v.biased:
            other = "bias_first" if order == "cap_first" else "cap_first"
            out.append((f"cap and bias in the other order ({other})", compose(scaled, alibi, bias, cap, other)))
    if alibi is not None:
        slopes = v.alibi_slopes.double().reshape(-1, v.alibi_slopes.shape[-1])
        slope = float(slopes[_at(slopes, 0, row.b), row.h])
        top_left = slope * _alibi_distance(row, top_left=True)
        out += [("ALiBi ignored", compose(scaled, None, bias, cap, order)),
                ("ALiBi slopes negated", compose(scaled, -alibi, bias, cap, order)),
                # one key more distance: -slope (|d| + 1) symmetric, slope (j - i - 1) linear
                ("ALiBi one key off (distance + 1)", compose(scaled, alibi - slope, bias, cap, order)),
                ("ALiBi aligned top-left", compose(scaled, top_left, bias, cap, order))]
    if bias is not None:
        out += [("attn_bias ignored", compose(scaled, alibi, None, cap, order)),
                ("attn_bias multiplied by the softmax scale", compose(scaled, alibi, bias * row.scale, cap, order))]
    if v.descales is not None:  # the dots are of the dequantized q and k
        qd, kd = (float(d) for d in v.descales[:2, row.b, row.h // row.group])
        out += [(f"{name} {how} (fp8)", compose(scaled * factor, alibi, bias, cap, order))
                for name, d in (("q_descale", qd), ("k_descale", kd))
                for how, factor in (("ignored", 1 / d), ("applied twice", d)) if d != 1.0]
    return out


def _alibi_distance(row, *, top_left: bool = False):
    """ALiBi's position term for this row (the slope's factor): -|i' - j| or j - i."""
    j = torch.arange(row.n_k, dtype=torch.float64)
    i = row.i + (0 if top_left else row.n_k - row.n_q)
    return -(i - j).abs() if row.variant.alibi == "symmetric" else j - row.i
