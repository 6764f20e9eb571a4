"""The gradients of the variant's own tensors (each tensor feature's ``Feature.gradient``), as sums of dS over
the walk's blocks.

Each is dS at the logits, reduced as the feature's term says: a sink is a key of value 0, so its
dS_i = -P_i(sink) D_i and the sink's gradient is that column summed over the batch and rows, one per query
head; a bias is added to the logits, so its gradient is dS where the bias enters (after the cap where the
spec says ``cap_first``, before it with ``bias_first``), summed over the dims the bias tensor broadcasts
along. The oracle (:mod:`.gradients`) and the budget (:mod:`.gradient_budget`) accumulate their per-element
values here, block by block, and reduce once.
"""

from __future__ import annotations

import torch

from ..features.base import Feature
from ..features.registry import REGISTRY
from .blockwise import add_into

__all__ = ["Reductions", "wanted", "bias_source"]


def _judged(variant) -> dict[str, Feature]:
    """The tensor features whose gradient the case has, by that gradient's name, in registry order."""
    return {f.gradient: f for f in REGISTRY if f.gradient and getattr(variant, f.name) is not None}


def wanted(variant) -> tuple[str, ...]:
    """The variant gradients a case has: one for each tensor feature it uses that has one."""
    return tuple(_judged(variant))


def bias_source(blk, at_logits, at_cap_input):
    """Which dS the bias sees: the one at the cap's input where the bias goes first (or there is no cap),
    else the one at the capped logits; without the sink's column."""
    chosen = at_cap_input if blk.cap is None or blk.bias_first else at_logits
    return chosen if blk.sink is None else chosen[..., :-1]


class Reductions:
    """Per-element sums of the variant gradients' parts (``parts``: e.g. value, bound, scale), filled block
    by block: a bias's over (P, G, Nq, Nk), a sink's over (P, G) (each block's sink column summed over rows)."""

    def __init__(self, variant, shapes, device, parts: tuple[str, ...]):
        self.features = _judged(variant)
        self.names, self.shapes, self.variant = tuple(self.features), shapes, variant
        P, G = shapes.batch * shapes.heads_kv, shapes.group
        dims = {"bias": (P, G, shapes.n_q, shapes.n_k), "sink": (P, G)}
        self.sums = {n: {p: torch.zeros(dims[f.term], dtype=torch.float64, device=device) for p in parts}
                     for n, f in self.features.items()}

    def term(self, name: str) -> str:
        """What the gradient's tensor is to the logits: "bias" or "sink"."""
        return self.features[name].term

    def tensor(self, name: str) -> torch.Tensor:
        """The variant's tensor whose gradient ``name`` is."""
        return getattr(self.variant, self.features[name].name)

    def share(self, blk, name: str, at_logits, at_cap_input):
        """The block's per-element part of gradient ``name``, of a dS given at the capped logits and at the
        cap's input: where the bias enters (:func:`bias_source`), or the sink's column."""
        if self.term(name) == "sink":
            return at_cap_input[..., -1:]
        return bias_source(blk, at_logits, at_cap_input)

    def add(self, ops, blk, name: str, values: dict) -> None:
        """Add one block's per-element ``values`` (part -> array, from :meth:`share`): a bias's (p, G, R, Nk),
        a sink's column (p, G, R, 1)."""
        if name not in self.sums:
            return
        for part, value in values.items():
            if self.term(name) == "sink":
                add_into(ops, self.sums[name][part], (blk.heads,), ops.sum(value, -2)[..., 0, 0])
            else:
                add_into(ops, self.sums[name][part], (blk.heads, slice(None), blk.sl), value)

    def reduced(self, name: str, part: str) -> torch.Tensor:
        """The part summed over what the gradient's tensor broadcasts along: a sink's (Hq,), a bias's the
        bias's own shape."""
        s = self.shapes
        full = self.sums[name][part]
        if self.term(name) == "sink":
            return full.reshape(s.batch, s.heads_q).sum(0)
        full = full.reshape(s.batch, s.heads_q, s.n_q, s.n_k)
        shape = tuple(self.tensor(name).shape)
        aligned = (1,) * (4 - len(shape)) + shape
        dims = tuple(d for d in range(4) if aligned[d] == 1 and full.shape[d] != 1)
        return (full.sum(dim=dims, keepdim=True) if dims else full).reshape(shape)

    def terms(self, name: str) -> int:
        """How many dS elements each element of the gradient sums (its accumulation's length)."""
        s = self.shapes
        if self.term(name) == "sink":
            return s.batch * s.n_q
        full = (s.batch, s.heads_q, s.n_q, s.n_k)
        shape = tuple(self.tensor(name).shape)
        aligned = (1,) * (4 - len(shape)) + shape
        count = 1
        for a, f in zip(aligned, full):
            count *= f if a == 1 else 1
        return count
