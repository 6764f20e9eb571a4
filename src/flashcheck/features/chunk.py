"""Chunked attention (Llama 4): ``chunk=c`` shows a query only the keys of its chunk of positions,
``(i + Nk - Nq) // c == j // c``, bottom-right aligned."""

from __future__ import annotations

import torch

from ..contract.counts import check_count
from ..contract.masks import MaskFn
from ..errors import InvalidArgument
from .base import Feature
from .draws import pick

__all__ = ["FEATURE", "chunk_mask", "chunked"]


def chunked(size: int, *, n_q: int, n_k: int) -> MaskFn:
    """Chunked attention (Llama 4), bottom-right aligned: query i sees the keys of its chunk of
    ``size`` positions, ``(i + n_k - n_q) // size == j // size``."""
    if int(size) < 1:
        raise InvalidArgument("size", size, "a chunk holds at least one key", "Pass size >= 1.")
    return chunk_mask(int(size), int(n_k) - int(n_q), None)


def _check(chunk):
    return check_count("chunk", chunk, none_ok=True, what="a chunk length",
                       fix="Pass chunk=N keys per chunk (N >= 1), or None for no chunks.")


def chunk_mask(chunk, offset, device):
    """The chunks' mask_mod: the chunk length a captured tensor; ``offset`` (Nk - Nq) aligns it bottom-right.
    Torch only: a reproducer script copies it."""
    size = torch.tensor(chunk, device=device)
    return lambda b, h, q_idx, kv_idx: (torch.div(q_idx + offset, size, rounding_mode="floor")
                                        == torch.div(kv_idx, size, rounding_mode="floor"))


FEATURE = Feature(
    name="chunk", flag="chunk", term="keys", summary="keys only in the query's chunk of c positions",
    check=_check, text=str,
    # tile sizes, odd sizes, one key
    regimes={"none": None, "tile": lambda gen, s: pick(gen, (16, 32, 64, 128)),
             "odd": lambda gen, s: pick(gen, (3, 7, 13, 37, 61)), "one": lambda gen, s: 1},
    visible=lambda value, n_q, n_k, heads_q: chunked(value, n_q=n_q, n_k=n_k),
    script={"mask_mod": chunk_mask},
)
