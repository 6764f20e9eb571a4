"""Sizes past what short cases reach: the ``elements`` regime of a recipe, whose batch grows until offsets into
its largest tensor need more than 31 bits (the long-context preset's ``large_tensors``)."""

from __future__ import annotations

import dataclasses

from ..contract.validation import Shapes

__all__ = ["ELEMENT_REGIMES", "INT32_ELEMENTS", "LARGE_DTYPES", "available_host_bytes", "drawing_bytes",
           "host_memory_problem", "past_int32"]

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


def drawing_bytes(s: Shapes) -> int:
    """Host memory the value regimes take to draw a case of shapes ``s``: q, k and v in float32 at once, and the
    rounded copy of the largest (an upper bound for 16-bit and fp8 inputs, which are what gets that large)."""
    q = s.batch * s.heads_q * s.n_q * s.head_dim
    k, v = (s.batch * s.heads_kv * s.n_k * d for d in (s.head_dim, s.head_dim_v))
    return 4 * (q + k + v) + 2 * max(q, k, v)


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
