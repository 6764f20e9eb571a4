"""The gradients of the variants' own tensors, dBias and dSinks, as sums of dS over the walk's blocks.

Both are dS at the logits, reduced: a sink is a key of value 0, so its dS_i = -P_i(sink) D_i and
dSinks_h = sum over the batch and rows of that column; ``attn_bias`` is added to the logits, so dBias is
dS where the bias enters (after the cap when the spec says ``cap_first``, before it with ``bias_first``),
summed over the dims the bias broadcasts along. The oracle (:mod:`.gradients`) and the budget
(:mod:`.gradient_budget`) accumulate their per-element values here, block by block, and reduce once.
"""

from __future__ import annotations

import torch

from ..features.registry import REGISTRY
from .blockwise import add_into

__all__ = ["VARIANT_GRADIENTS", "Reductions", "wanted", "bias_source"]

VARIANT_GRADIENTS = tuple(f.gradient for f in REGISTRY if f.gradient)  # each tensor feature's, where judged


def wanted(variant) -> tuple[str, ...]:
    """The variant gradients a case has: dbias with an ``attn_bias``, dsinks with sinks."""
    return tuple(f.gradient for f in REGISTRY if f.gradient and getattr(variant, f.name) is not None)


def bias_source(blk, at_logits, at_cap_input):
    """Which dS the bias sees: the one at the cap's input where the bias goes first (or there is no cap),
    else the one at the capped logits; without the sink's column."""
    chosen = at_cap_input if blk.softcap is None or blk.bias_first else at_logits
    return chosen if blk.sink is None else chosen[..., :-1]


class Reductions:
    """Per-element sums of the variant gradients' parts (``parts``: e.g. value, bound, scale), filled block
    by block: dbias over (P, G, Nq, Nk), dsinks over (P, G) (each block's sink column summed over rows)."""

    def __init__(self, variant, shapes, device, parts: tuple[str, ...]):
        self.names, self.shapes, self.variant = wanted(variant), shapes, variant
        P, G = shapes.batch * shapes.heads_kv, shapes.group
        dims = {"dbias": (P, G, shapes.n_q, shapes.n_k), "dsinks": (P, G)}
        self.sums = {n: {p: torch.zeros(dims[n], dtype=torch.float64, device=device) for p in parts}
                     for n in self.names}

    def add(self, ops, blk, name: str, values: dict) -> None:
        """Add one block's per-element ``values`` (part -> array): dbias (p, G, R, Nk), dsinks the sink
        column (p, G, R, 1)."""
        if name not in self.sums:
            return
        for part, value in values.items():
            if name == "dsinks":
                add_into(ops, self.sums[name][part], (blk.heads,), ops.sum(value, -2)[..., 0, 0])
            else:
                add_into(ops, self.sums[name][part], (blk.heads, slice(None), blk.sl), value)

    def reduced(self, name: str, part: str) -> torch.Tensor:
        """The part summed over what the gradient's tensor broadcasts along: dsinks (Hq,), dbias the
        bias's own shape."""
        s = self.shapes
        full = self.sums[name][part]
        if name == "dsinks":
            return full.reshape(s.batch, s.heads_q).sum(0)
        full = full.reshape(s.batch, s.heads_q, s.n_q, s.n_k)
        shape = tuple(self.variant.attn_bias.shape)
        aligned = (1,) * (4 - len(shape)) + shape
        dims = tuple(d for d in range(4) if aligned[d] == 1 and full.shape[d] != 1)
        return (full.sum(dim=dims, keepdim=True) if dims else full).reshape(shape)

    def terms(self, name: str) -> int:
        """How many dS elements each element of the gradient sums (its accumulation's length)."""
        s = self.shapes
        if name == "dsinks":
            return s.batch * s.n_q
        full = (s.batch, s.heads_q, s.n_q, s.n_k)
        shape = tuple(self.variant.attn_bias.shape)
        aligned = (1,) * (4 - len(shape)) + shape
        count = 1
        for a, f in zip(aligned, full):
            count *= f if a == 1 else 1
        return count
