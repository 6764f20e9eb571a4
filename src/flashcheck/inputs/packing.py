"""Adversarial physical forms for a logical batch: sequence lengths, offsets, pages and block tables.

A recipe names a length regime (:data:`LENGTH_REGIMES`), for a paged kernel a page regime
(:data:`PAGE_REGIMES`), for a varlen kernel that takes ``seqused_k`` a key-use regime (:data:`SEQUSED_REGIMES`),
and a poison; :func:`serving_case` turns them, with the recipe's seed, into a
:class:`~flashcheck.inputs.serving.ServingCase` over the dense case the recipe built.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import InvalidArgument
from .case import AttentionCase
from .serving import ServingCase

__all__ = ["LENGTH_REGIMES", "PAGE_REGIMES", "SEQUSED_REGIMES", "serving_case"]

# Simplest first (hypothesis shrinks towards the start).
LENGTH_REGIMES = ("full", "ragged", "empty_sequences", "single_tokens", "fewer_tokens_than_batch", "padded_max")
# Page sizes: 1, 16, 64, 256, and the smallest from 3 up that divides no sequence's key count.
PAGE_REGIMES = ("16", "1", "64", "256", "nondividing")
# seqused_k: not passed, or passed with 0 to MAX_SLACK poisoned key slots after each sequence's used keys (one
# sequence at least has some).
SEQUSED_REGIMES = ("none", "slack")
MAX_SLACK = 40


def _lengths(regime: str, batch: int, limit: int, rng: np.random.Generator) -> list[int]:
    if regime in ("full",):
        return [limit] * batch
    if regime in ("ragged", "padded_max"):
        return rng.integers(1, limit + 1, batch).tolist()
    if regime == "empty_sequences":  # one empty, the others anywhere from 0 up, one of them not (a batch of 1: none)
        out = rng.integers(0, limit + 1, batch).tolist()
        empty = int(rng.integers(batch))
        out[empty] = 0
        if batch > 1:
            kept = (empty + 1 + int(rng.integers(batch - 1))) % batch
            out[kept] = max(out[kept], 1)
        return out
    if regime == "single_tokens":
        return [1] * batch
    if regime == "fewer_tokens_than_batch":  # fewer tokens in all than sequences (a batch of 1: one), most empty
        out = [0] * batch
        for b in rng.choice(batch, size=max(1, (batch - 1) // 2), replace=False).tolist():
            out[b] = 1
        return out
    raise InvalidArgument("packing", regime, "unknown length regime", f"Use one of {list(LENGTH_REGIMES)}.")


def _page_size(regime: str, k_lens: list[int]) -> int:
    if regime != "nondividing":
        return int(regime)
    size = 3
    while any(n and n % size == 0 for n in k_lens):
        size += 1
    return size


def _block_table(k_lens: list[int], page_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """A block table whose sequences' pages lie scrambled in a pool with spare (poisoned) pages; entries past
    a sequence's pages point at spare pages."""
    pages = [-(-n // page_size) for n in k_lens]
    width = max(pages + [0]) + 1  # one column past the longest sequence's pages
    spare = 1 + int(rng.integers(0, 4))
    num_blocks = sum(pages) + spare
    order = rng.permutation(num_blocks)
    table, used = np.empty((len(k_lens), width), dtype=np.int32), 0
    for b, count in enumerate(pages):
        table[b, :count] = order[used:used + count]
        table[b, count:] = order[sum(pages) + rng.integers(0, spare, width - count)]
        used += count
    return torch.from_numpy(table), num_blocks


def _slack(regime: str, batch: int, rng: np.random.Generator) -> tuple | None:
    if regime == "none":
        return None
    if regime != "slack":
        raise InvalidArgument("seqused", regime, "unknown key-use regime", f"Use one of {list(SEQUSED_REGIMES)}.")
    out = rng.integers(0, MAX_SLACK + 1, batch)
    out[int(rng.integers(batch))] = int(rng.integers(1, MAX_SLACK + 1))
    return tuple(out.tolist())


def serving_case(base: AttentionCase, *, form: str, packing: str, pages: str, poison: str, seed: int,
                 same_lengths: bool = False, seqused: str = "none") -> ServingCase:
    """The serving-form case over ``base`` that the regimes and ``seed`` name (``same_lengths``: each sequence's
    query count is its key count, for kernels whose spec says ``equal_lengths``; ``seqused``: a varlen case's
    regime of :data:`SEQUSED_REGIMES`)."""
    rng = np.random.default_rng([seed, 0x5E_4F])
    s = base.shapes
    k_lens = _lengths(packing, s.batch, s.n_k, rng)
    if form == "paged":
        size = _page_size(pages, k_lens)
        table, num_blocks = _block_table(k_lens, size, rng)
        return ServingCase(base, "paged", [s.n_q] * s.batch, k_lens, page_size=size, block_table=table,
                           num_blocks=num_blocks, poison=poison)
    q_lens = list(k_lens) if same_lengths else _lengths(packing, s.batch, s.n_q, rng)
    pad = int(rng.integers(1, 64)) if packing == "padded_max" else 0
    return ServingCase(base, "varlen", q_lens, k_lens, max_seqlen_pad=pad, poison=poison,
                       k_slack=_slack(seqused, s.batch, rng))
