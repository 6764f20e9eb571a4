"""Small draws the features' regimes share: a choice from a list, a whole number up to n, tile edges."""

from __future__ import annotations

import torch

__all__ = ["TILE_EDGES", "pick", "upto"]

TILE_EDGES = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)


def pick(gen: torch.Generator, options) -> int:
    return options[int(torch.randint(0, len(options), (1,), generator=gen))]


def upto(gen: torch.Generator, n: int) -> int:
    """A whole number in [0, n]."""
    return int(torch.randint(0, max(n, 0) + 1, (1,), generator=gen))
