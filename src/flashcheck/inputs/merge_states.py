"""Partial states of split-KV attention to merge: S splits of R rows, each a partial output (Dv values) and its
natural-log lse, drawn in named regimes (small named functions, one per way a merge goes wrong)."""

from __future__ import annotations

import math

import torch

__all__ = ["MERGE_REGIMES", "draw_states"]


def _random(g, s, r, dv):
    return torch.randn(s, r, dv, generator=g), torch.randn(s, r, generator=g) * 3


def _empty_splits(g, s, r, dv):
    """Some splits saw no key (lse -inf, out 0): exp(-inf - m) must give 0, not NaN."""
    outs, lses = _random(g, s, r, dv)
    empty = torch.rand(s, r, generator=g) < 0.5
    empty[0] &= torch.rand(r, generator=g) < 0.5  # most rows keep a live split, some lose them all
    return torch.where(empty[..., None], 0.0, outs), torch.where(empty, -math.inf, lses)


def _all_empty(g, s, r, dv):
    """Every split of every row empty: out 0, and the lse the convention says."""
    return torch.zeros(s, r, dv), torch.full((s, r), -math.inf)


def _dominant(g, s, r, dv):
    """One split far above the others: their weights underflow."""
    outs, lses = _random(g, s, r, dv)
    lses[int(torch.randint(s, (1,), generator=g))] += 100.0
    return outs, lses


def _huge_lse(g, s, r, dv):
    """lse near 1e4 (long rows of large logits): a merge that does not subtract the max overflows, and a base-2
    conversion rounds at 2^-10."""
    outs, lses = _random(g, s, r, dv)
    return outs, lses + 1e4


def _negative_lse(g, s, r, dv):
    """lse near -1e4 (rows of very negative logits): e^lse underflows unless taken relative to the max."""
    outs, lses = _random(g, s, r, dv)
    return outs, lses - 1e4


def _ties(g, s, r, dv):
    outs, _ = _random(g, s, r, dv)
    return outs, torch.full((s, r), 1.5)


def _large_values(g, s, r, dv):
    outs, lses = _random(g, s, r, dv)
    return (outs * 2e4).clamp(-6e4, 6e4), lses  # inside fp16, near its top


MERGE_REGIMES = {f.__name__.lstrip("_"): f for f in (_random, _empty_splits, _all_empty, _dominant, _huge_lse,
                                                     _negative_lse, _ties, _large_values)}


def draw_states(regime: str, *, seed: int, splits: int, rows: int, head_dim: int, dtype) -> tuple:
    """(outs (S, R, Dv) in ``dtype``, lses (S, R) fp32, natural log) of ``regime``; the lse are exact fp32
    values and the outs exact in ``dtype``: the oracle sees what the merge sees."""
    g = torch.Generator().manual_seed(seed)
    outs, lses = MERGE_REGIMES[regime](g, splits, rows, head_dim)
    return outs.to(dtype), lses.float()
