"""Adversarial regimes of the attention variants, as named pure functions of (generator, shapes), and of
(generator, shapes, dtype) for ``attn_bias`` (the bias's dtype: its lowest value, and what it can hold).

Each feature of :mod:`flashcheck.contract.variants` has its regimes, "none" first (hypothesis shrinks
towards it), each drawn from where reported bugs cluster: caps far below and above the logits (a cap
applied to the wrong logits shows most where it bites), windows whose edges sit on tile edges or leave
rows no key, chunks of one key and of odd sizes, sinks far above and below the logits and -inf sinks,
ALiBi slopes steep, tiny, negative and per batch entry, biases broadcast every way, hiding keys and whole
rows, at the dtype's lowest value and below the finite sentinels kernels use for "masked".
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..contract.formats import format_of
from ..contract.validation import Shapes
from ..contract.variants import FEATURES, Variant
from ..errors import InvalidArgument
from .drawing import seeded

__all__ = ["BIAS_LIMIT", "VARIANT_REGIMES", "WIDE_BIASES", "make_variant"]

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


def _geometric(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes, 2^(-8 k / H) for k = 1..H."""
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, dtype=torch.float32) / heads)


# -- ALiBi slopes, (Hq,) or (B, Hq) fp32; the bias reaches slope * Nk on long rows.
SLOPES: dict[str, Callable[[torch.Generator, Shapes], torch.Tensor] | None] = {
    "none": None,
    "geometric": lambda gen, s: _geometric(s.heads_q),  # a slope indexed by the K/V head shows under GQA
    "per_batch": lambda gen, s: torch.exp2(-8 * torch.rand(s.batch, s.heads_q, generator=gen)),
    "steep": lambda gen, s: 1 + 7 * torch.rand(s.heads_q, generator=gen),  # the bias outweighs the logits
    "tiny": lambda gen, s: 1e-4 * (1 + torch.rand(s.heads_q, generator=gen)),  # lost if rounded with the logits
    "negative": lambda gen, s: -_geometric(s.heads_q),  # allowed: a kernel that takes |slope| flips them
}

BIAS_LIMIT = 1 << 22  # elements: past it, a bias keeps fewer of (B, Hq, Nq, Nk) (long rows), as _dims drops them
WIDE_BIASES = ("below_1e30",)  # regimes past fp16's range: an fp16 bias cannot hold them


def _dims(s: Shapes, pattern: str = "bhqk", drop: str = "bhq") -> tuple[int, ...]:
    """The bias shape of ``pattern`` (b, h, q, k: B, Hq, Nq, Nk; 1: broadcast), with the dims of ``drop``
    set to 1 in turn while it holds more than :data:`BIAS_LIMIT` elements."""
    size = {"b": s.batch, "h": s.heads_q, "q": s.n_q, "k": s.n_k, "1": 1}
    dims = [size[c] for c in pattern]
    for c in drop:
        if math.prod(dims) <= BIAS_LIMIT:
            break
        dims = [1 if p == c else d for p, d in zip(pattern, dims)]
    return tuple(dims)


def _normal(pattern: str = "bhqk", sigma: float = 1.0):
    return lambda gen, s, dtype: sigma * torch.randn(_dims(s, pattern), generator=gen)


def _rows(value: Callable[[torch.dtype], float]):
    """N(0, 1), with every key of about half the rows at ``value(dtype)``."""
    def draw(gen, s, dtype):
        b = torch.randn(_dims(s, drop="bhk"), generator=gen)
        return b.masked_fill(torch.rand(b.shape[:-1] + (1,), generator=gen) < 0.5, value(dtype))
    return draw


def _hidden_keys(gen, s: Shapes, dtype) -> torch.Tensor:
    b = torch.randn(_dims(s), generator=gen)
    return b.masked_fill(torch.rand(b.shape, generator=gen) < 0.3, -math.inf)


def _lowest(gen, s: Shapes, dtype) -> torch.Tensor:
    """fp16's lowest finite value, -65504, on random keys and on every key of some rows: a bias added in
    fp16 overflows to -inf and hides keys that are visible. (fp32's lowest is no test: past 2.4e38 a
    logit overflows the base-2 domain that legal kernels compute in.)"""
    b = torch.randn(_dims(s), generator=gen)
    hit = (torch.rand(b.shape, generator=gen) < 0.3) | (torch.rand(b.shape[:-1] + (1,), generator=gen) < 0.25)
    return b.masked_fill(hit, torch.finfo(torch.float16).min)


def _dominant(gen, s: Shapes, dtype) -> torch.Tensor:
    """|b| of 10^3..10^4, either sign: the bias decides the softmax (a bias scaled with the logits shows)."""
    dims = _dims(s)
    sign = torch.where(torch.rand(dims, generator=gen) < 0.5, -1.0, 1.0)
    return sign * 10 ** (3 + torch.rand(dims, generator=gen))


def _row_constant(gen, s: Shapes, dtype) -> torch.Tensor:
    """One value for every key of a row, stored full: O unchanged, lse moved by it."""
    dims = _dims(s, drop="bhk")
    return (8 * torch.randn(dims[:3] + (1,), generator=gen)).expand(dims).contiguous()


# -- attn_bias, broadcastable to (B, Hq, Nq, Nk); -inf hides a key. Logits of the value regimes sit near 0..10.
BIASES: dict[str, Callable[[torch.Generator, Shapes, torch.dtype], torch.Tensor] | None] = {
    "none": None,
    "random": _normal(),  # full (B, Hq, Nq, Nk): a bias read at the wrong batch, head, row or key
    "keys": _normal("111k", 2.0),  # stride-0 dims misread
    "per_batch": _normal("b1qk", 2.0),
    "per_row": _normal("1hq1", 2.0),  # one value a row: only lse shows it
    "matrix": _normal("qk", 2.0),  # 2-D, right-aligned
    "hidden_keys": _hidden_keys,  # -inf as a mask: NaN from -inf - -inf
    "hidden_rows": _rows(lambda dtype: -math.inf),  # rows with no visible key: O = 0, lse = -inf
    "lowest": _lowest,
    "below_5e4": _rows(lambda dtype: -6e4),  # a finite "masked" sentinel (-5e4, fp16's -inf stand-in) empties rows
    "below_1e30": _rows(lambda dtype: -1e31),  # a running max started at -1e30 never moves: l = 0
    "dominant": _dominant,
    "row_constant": _row_constant,
}

VARIANT_REGIMES: dict[str, dict] = {"softcap": SOFTCAPS, "alibi_slopes": SLOPES, "attn_bias": BIASES,
                                    "window": WINDOWS, "chunk": CHUNKS, "sinks": SINKS}
assert tuple(VARIANT_REGIMES) == FEATURES


def make_variant(regimes: dict[str, str], *, shapes: Shapes, seed: int, bias_dtype="fp32", alibi: str = "symmetric",
                 bias_order: str = "cap_first") -> Variant:
    """The :class:`Variant` of the named regime of each feature (``regimes``: feature -> regime name), its
    ``attn_bias`` in ``bias_dtype``, with the kernel's ``alibi`` mode and ``bias_order``."""
    gen = seeded(int(seed) + 3)
    parts = {}
    for feature in FEATURES:
        name = regimes.get(feature, "none")
        table = VARIANT_REGIMES[feature]
        if name not in table:
            raise InvalidArgument(f"{feature} regime", name, f"unknown {feature} regime", f"Use one of {list(table)}.")
        if table[name] is None:
            continue
        if feature == "attn_bias":
            parts[feature] = _rounded_bias(name, table[name], gen, shapes, format_of(bias_dtype, argument="bias_dtype"))
        else:
            parts[feature] = table[name](gen, shapes)
    return Variant(**parts, alibi=alibi, bias_order=bias_order)


def _rounded_bias(name: str, regime, gen, shapes: Shapes, fmt) -> torch.Tensor:
    """The regime's bias rounded to ``fmt``; an error where a finite value would round to infinity."""
    bias = regime(gen, shapes, fmt.dtype)
    out = bias.to(fmt.dtype)
    if bool((torch.isinf(out) & torch.isfinite(bias)).any()):
        raise InvalidArgument("attn_bias regime", name, f"its values lie past {fmt.name}'s range",
                              "Draw it with an fp32 bias (a kernel spec with fp32_bias=True) or bf16 or fp32 inputs.")
    return out.contiguous()
