"""Sizes past what short cases reach: the ``elements`` regime of a recipe, whose batch grows until offsets into
its largest tensor need more than 31 bits (the long-context preset's ``large_tensors``)."""

from __future__ import annotations

import dataclasses

from ..contract.validation import Shapes

__all__ = ["ELEMENT_REGIMES", "INT32_ELEMENTS", "LARGE_DTYPES", "LEAN_BYTES", "available_host_bytes", "drawing_bytes",
           "drawn_by_entry", "entry_seed", "host_memory_problem", "past_int32"]

# A tensor past this many elements has offsets an int32 cannot hold.
INT32_ELEMENTS = 2**31
# How a recipe sizes its tensors: as drawn, or with the batch grown until its last entry starts INT32_ELEMENTS
# into the largest tensor (one recipe in eight of a preset with large_tensors; 16-bit inputs only, which keep such
# a case within an H200's memory: K and V take 4 GiB and more each).
ELEMENT_REGIMES = ("none",) * 7 + ("past_int32",)
# Above this many bytes of float32 values, a case is drawn one batch entry at a time (drawn_by_entry).
LEAN_BYTES = 2**31
LARGE_DTYPES = ("fp16", "bf16")


def past_int32(s: Shapes) -> Shapes:
    """``s`` with the smallest batch whose last entry starts 2^31 elements or more into the largest tensor (q, k,
    v or out): every offset into that entry needs a 32nd bit, where the offsets of a batch just past 2^31 in all
    may still fit (the kernel then adds the rest to a 64-bit pointer)."""
    per_entry = max(s.heads_q * s.n_q * max(s.head_dim, s.head_dim_v), s.heads_kv * s.n_k * max(s.head_dim,
                                                                                                  s.head_dim_v))
    return dataclasses.replace(s, batch=max(s.batch, -(-INT32_ELEMENTS // per_entry) + 1))


def drawn_by_entry(s: Shapes) -> bool:
    """Whether a case of shapes ``s`` is drawn one batch entry at a time (:func:`entry_seed`): its float32 values
    before rounding would take more than LEAN_BYTES at once (about 20 GiB for a case past 2^31 elements, which
    four campaign processes drawing on one GPU, or a host, do not hold)."""
    return s.batch > 1 and 4 * _elements(s) > LEAN_BYTES


def entry_seed(seed: int, entry: int) -> int:
    """The seed of batch entry ``entry`` of a case drawn by entry: a function of the recipe's seed alone."""
    return (seed * 1_000_003 + entry + 1) % 2**63


def drawing_bytes(s: Shapes) -> int:
    """Memory the value regimes take to draw a case of shapes ``s``: the float32 values of the case (or of one
    batch entry, :func:`drawn_by_entry`) at once, the rounded copy of the largest, and the rounded case (an upper
    bound for 16-bit and fp8 inputs, which are what gets that large)."""
    q, k, v = _sizes(s)
    if not drawn_by_entry(s):
        return 4 * (q + k + v) + 2 * max(q, k, v)
    return 2 * (q + k + v) + (4 * (q + k + v) + 2 * max(q, k, v)) // s.batch


def _sizes(s: Shapes) -> tuple[int, int, int]:
    q = s.batch * s.heads_q * s.n_q * s.head_dim
    k, v = (s.batch * s.heads_kv * s.n_k * d for d in (s.head_dim, s.head_dim_v))
    return q, k, v


def _elements(s: Shapes) -> int:
    return sum(_sizes(s))


def available_host_bytes() -> int | None:
    """The host memory available now (Linux's MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory_problem(s: Shapes) -> str | None:
    """Why a case of shapes ``s`` cannot be drawn on this host (a reason for an ``oom`` skip), or None: drawing it
    would take more memory than is available, and the process would be killed with every result in it."""
    need, have = drawing_bytes(s), available_host_bytes()
    if have is None or need <= have:
        return None
    return (f"drawing the case takes about {need / 2**30:.1f} GiB of host memory, {have / 2**30:.1f} GiB is "
            "available (a smaller max_n, max_decode_n or no large_tensors in the preset fits this host)")
