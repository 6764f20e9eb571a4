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

__all__ = ["FEATURE", "window", "window_mask"]


def window(left: int, right: int, *, n_q: int, n_k: int) -> masks.MaskFn:
    """flash-attention's ``window_size=(left, right)``, bottom-right aligned: query i sees keys j with
    ``i + n_k - n_q - left <= j <= i + n_k - n_q + right``; -1 leaves that side unbounded."""
    return window_mask((int(left), int(right)), int(n_k) - int(n_q), None)


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


def _edge(window, i: int, j: int, n_q: int, n_k: int, inside: bool) -> str:
    """Key ``j`` to query ``i``: the window's left or right edge (``inside``) or one past it, else ''."""
    left, right = window
    centre = i + n_k - n_q
    for side, end, step in (("left", centre - left, -1), ("right", centre + right, 1)):
        if (left if side == "left" else right) >= 0 and j == end + (0 if inside else step):
            return f" (the window's {side} edge)" if inside else f" (one past the window's {side} edge)"
    return ""


def _band_mask(gen, s) -> torch.Tensor:
    """A causal band of 1 to Nk/2 keys as a boolean mask, bottom-right aligned."""
    window = int(torch.randint(1, max(2, s.n_k // 2 + 1), (1,), generator=gen))
    i = torch.arange(s.n_q).view(-1, 1) + (s.n_k - s.n_q)
    j = torch.arange(s.n_k).view(1, -1)
    return ((j <= i) & (j > i - window)).view(1, 1, s.n_q, s.n_k)


def window_mask(window, offset, device):
    """The window's mask_mod: each side a captured tensor (one compiled kernel for every width; on the CPU for
    ``device`` None, which any device's indices take), or no bound for -1; ``offset`` (Nk - Nq) aligns it
    bottom-right. Torch only: a reproducer script copies it."""
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
    visible=lambda value, n_q, n_k, heads_q: window(*value, n_q=n_q, n_k=n_k),
    edge=_edge,
    neutral_text="a full window for bottom-right causal",
    masks={"sliding_window": _band_mask},
    script={"mask_mod": window_mask},
)
