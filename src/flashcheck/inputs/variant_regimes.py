"""Adversarial regimes of the attention variants, as named pure functions of (generator, shapes).

Each feature of :mod:`flashcheck.contract.variants` has its regimes, "none" first (hypothesis shrinks
towards it), each drawn from where reported bugs cluster: caps far below and above the logits (a cap
applied to the wrong logits shows most where it bites), windows whose edges sit on tile edges or leave
rows no key, chunks of one key and of odd sizes, sinks far above and below the logits and -inf sinks.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..contract.validation import Shapes
from ..contract.variants import FEATURES, Variant
from ..errors import InvalidArgument

__all__ = ["VARIANT_REGIMES", "make_variant"]

TILE_EDGES = (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)


def _pick(gen: torch.Generator, options) -> int:
    return options[int(torch.randint(0, len(options), (1,), generator=gen))]


def _upto(gen: torch.Generator, n: int) -> int:
    """A whole number in [0, n]."""
    return int(torch.randint(0, max(n, 0) + 1, (1,), generator=gen))


# -- soft-capping: Gemma 2's caps are 50 (attention) and 30 (final logits); 1 saturates every logit.
SOFTCAPS: dict[str, Callable[[torch.Generator, Shapes], float] | None] = {
    "none": None,
    "cap_50": lambda gen, s: 50.0,
    "cap_30": lambda gen, s: 30.0,
    "cap_1": lambda gen, s: 1.0,
}

# -- windows (left, right), bottom-right aligned; -1 is unbounded.
WINDOWS: dict[str, Callable[[torch.Generator, Shapes], tuple[int, int]] | None] = {
    "none": None,
    "causal_band": lambda gen, s: (_upto(gen, s.n_k), 0),  # Mistral's sliding window
    "band": lambda gen, s: (_upto(gen, s.n_k // 2), _upto(gen, s.n_k // 2)),
    "tile_edge": lambda gen, s: (_pick(gen, TILE_EDGES), _pick(gen, (0, -1) + TILE_EDGES[:3])),
    "diagonal": lambda gen, s: (0, 0),  # one key a row, none for rows past the keys when Nq > Nk
    "unbounded_left": lambda gen, s: (-1, _upto(gen, 3)),
    "unbounded_right": lambda gen, s: (_upto(gen, 3), -1),
}

# -- chunks (Llama 4's chunked attention): tile sizes, odd sizes, one key.
CHUNKS: dict[str, Callable[[torch.Generator, Shapes], int] | None] = {
    "none": None,
    "tile": lambda gen, s: _pick(gen, (16, 32, 64, 128)),
    "odd": lambda gen, s: _pick(gen, (3, 7, 13, 37, 61)),
    "one": lambda gen, s: 1,
}


def _sinks(values: Callable[[torch.Generator, int], torch.Tensor]):
    return lambda gen, s: values(gen, s.heads_q)


# -- sinks, one logit per query head (gpt-oss); logits of the value regimes sit near 0..10 (10^4.. huge).
SINKS: dict[str, Callable[[torch.Generator, Shapes], torch.Tensor] | None] = {
    "none": None,
    "moderate": _sinks(lambda gen, h: 2 * torch.randn(h, generator=gen)),
    "above": _sinks(lambda gen, h: 30 + torch.rand(h, generator=gen)),  # the sink takes most of each row
    "below": _sinks(lambda gen, h: -30 - torch.rand(h, generator=gen)),
    "mixed": _sinks(lambda gen, h: torch.tensor([-math.inf, -50.0, 0.0, 50.0])[torch.randint(0, 4, (h,),
                                                                                               generator=gen)]),
}

VARIANT_REGIMES: dict[str, dict] = {"softcap": SOFTCAPS, "alibi_slopes": {"none": None}, "attn_bias": {"none": None},
                                    "window": WINDOWS, "chunk": CHUNKS, "sinks": SINKS}
assert tuple(VARIANT_REGIMES) == FEATURES


def make_variant(regimes: dict[str, str], *, shapes: Shapes, seed: int) -> Variant:
    """The :class:`Variant` of the named regime of each feature (``regimes``: feature -> regime name)."""
    gen = torch.Generator().manual_seed(int(seed) + 3)
    parts = {}
    for feature in FEATURES:
        name = regimes.get(feature, "none")
        table = VARIANT_REGIMES[feature]
        if name not in table:
            raise InvalidArgument(f"{feature} regime", name, f"unknown {feature} regime", f"Use one of {list(table)}.")
        if table[name] is not None:
            parts[feature] = table[name](gen, shapes)
    return Variant(**parts)
