"""Sliding windows: ``window=(left, right)`` shows query i the keys j with ``i + Nk - Nq - left <= j <= i + Nk - Nq
+ right``, bottom-right aligned as flash-attention's ``window_size``; -1 leaves a side unbounded. ``(Nk - 1, 0)``
is the bottom-right causal mask, the feature's neutral value in place of ``causal="bottom_right"``."""

from __future__ import annotations

import torch

from ..contract import masks
from ..contract.counts import check_count
from ..errors import InvalidArgument
from .base import Feature
from .draws import TILE_EDGES, pick, upto

__all__ = ["FEATURE", "window_mask"]


def _check(window):
    if window is None:
        return None
    fix = "Pass window=(left, right) with whole numbers >= -1 (-1: unbounded on that side)."
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise InvalidArgument("window", window, "expected a pair (left, right)", fix)
    return tuple(check_count("window", w, minimum=-1, what="a window side", fix=fix) for w in window)


def _neutral(variant, causal: str, spec, shapes):
    if causal != "bottom_right" or "none" not in spec.causal:
        return None
    n_k = shapes.n_k
    return (f"window=({n_k - 1},0) in place of causal='bottom_right'", variant.replace(window=(n_k - 1, 0)), "none")


def window_mask(window, offset, device):
    """The window's mask_mod: each side a captured tensor (one compiled kernel for every width), or no bound for
    -1; ``offset`` (Nk - Nq) aligns it bottom-right. Torch only: a reproducer script copies it."""
    left, right = (torch.tensor(w, device=device) if w >= 0 else None for w in window)

    def window_mod(b, h, q_idx, kv_idx):
        out = torch.ones_like(q_idx - kv_idx, dtype=torch.bool)
        out = out if left is None else out & (kv_idx >= q_idx + offset - left)
        return out if right is None else out & (kv_idx <= q_idx + offset + right)

    return window_mod


FEATURE = Feature(
    name="window", flag="window", term="keys", summary="keys within (left, right) of the query's diagonal",
    check=_check, text=lambda value: f"({value[0]},{value[1]})",
    to_json=list, from_json=tuple,
    regimes={
        "none": None,
        "causal_band": lambda gen, s: (upto(gen, s.n_k), 0),  # Mistral's sliding window
        "band": lambda gen, s: (upto(gen, s.n_k // 2), upto(gen, s.n_k // 2)),
        "tile_edge": lambda gen, s: (pick(gen, TILE_EDGES), pick(gen, (0, -1) + TILE_EDGES[:3])),
        "diagonal": lambda gen, s: (0, 0),  # one key a row, none for rows past the keys when Nq > Nk
        "unbounded_left": lambda gen, s: (-1, upto(gen, 3)),
        "unbounded_right": lambda gen, s: (upto(gen, 3), -1),
    },
    neutral=_neutral,
    visible=lambda value, n_q, n_k: masks.window(*value, n_q=n_q, n_k=n_k),
    script={"mask_mod": window_mask},
)
