"""Sizes past what short cases reach: the ``elements`` regime of a recipe, whose batch grows until offsets into
its largest tensor need more than 31 bits (the long-context preset's ``large_tensors``)."""

from __future__ import annotations

import dataclasses

from ..contract.validation import Shapes

__all__ = ["ELEMENT_REGIMES", "INT32_ELEMENTS", "LARGE_DTYPES", "past_int32"]

# A tensor past this many elements has offsets an int32 cannot hold.
INT32_ELEMENTS = 2**31
# How a recipe sizes its tensors: as drawn, or with the batch grown until its last entry starts INT32_ELEMENTS
# into the largest tensor (one recipe in eight of a preset with large_tensors; 16-bit inputs only, which keep such
# a case within an H200's memory: K and V take 4 GiB and more each).
ELEMENT_REGIMES = ("none",) * 7 + ("past_int32",)
LARGE_DTYPES = ("fp16", "bf16")


def past_int32(s: Shapes) -> Shapes:
    """``s`` with the smallest batch whose last entry starts 2^31 elements or more into the largest tensor (q, k,
    v or out): every offset into that entry needs a 32nd bit, where the offsets of a batch just past 2^31 in all
    may still fit (the kernel then adds the rest to a 64-bit pointer)."""
    per_entry = max(s.heads_q * s.n_q * max(s.head_dim, s.head_dim_v), s.heads_kv * s.n_k * max(s.head_dim,
                                                                                                  s.head_dim_v))
    return dataclasses.replace(s, batch=max(s.batch, -(-INT32_ELEMENTS // per_entry) + 1))
