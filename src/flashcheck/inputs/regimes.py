"""Adversarial input regimes as named pure functions of (seed, shapes, dtype).

Each *value regime* builds q, k, v whose numbers stress one part of a flash kernel (huge logits, ties,
a running max that grows at every tile, ...). Each *mask regime* builds a boolean "may attend" mask.
Large tensors come from a regime name plus a seed, so a test or a campaign can record, replay and
shrink the recipe instead of the numbers.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import torch

from ..contract.formats import format_of
from ..contract.validation import Shapes
from ..errors import InvalidArgument
from ..features.registry import REGISTRY
from .drawing import seeded
from .sizes import drawn_by_entry, entry_seed

__all__ = ["FEATURE_MASKS", "VALUE_REGIMES", "MASK_REGIMES", "SCALE_REGIMES", "UPSTREAM_REGIMES", "make_values", "make_mask",
           "make_scale", "make_upstream"]

Values = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _randn(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float32)


def _qkv_shapes(s: Shapes):
    return ((s.batch, s.heads_q, s.n_q, s.head_dim), (s.batch, s.heads_kv, s.n_k, s.head_dim),
            (s.batch, s.heads_kv, s.n_k, s.head_dim_v))


# The regimes change the float32 values they drew in place where that gives the same numbers: a long row's K and
# V are 8 GiB each in float32, and a copy of one is what a GPU that draws them runs out of memory on.


def random(gen, s: Shapes, fmax: float) -> Values:
    """Standard normal q, k, v: the diffuse case every test suite already covers."""
    qs, ks, vs = _qkv_shapes(s)
    return _randn(gen, *qs), _randn(gen, *ks), _randn(gen, *vs)


def peaked(gen, s: Shapes, fmax: float) -> Values:
    """Each query is aligned with one key: one weight near 1, the rest far below."""
    q, k, v = random(gen, s, fmax)
    group = s.heads_q // s.heads_kv
    pick = torch.randint(0, s.n_k, (s.batch, s.heads_q, s.n_q), generator=gen)
    # each query head's pick from its own K/V head, read in place (128 copies of an MLA cache would not fit)
    batch = torch.arange(s.batch).view(-1, 1, 1)
    kv_head = (torch.arange(s.heads_q) // group).view(1, -1, 1)
    q = 4.0 * k[batch, kv_head, pick]
    return q, k, v


def growing_max(gen, s: Shapes, fmax: float) -> Values:
    """Logits increase along the keys, so the running max grows at every tile and every rescale counts."""
    q, k, v = random(gen, s, fmax)
    direction = _randn(gen, 1, 1, 1, s.head_dim)
    ramp = torch.linspace(0.0, 6.0, s.n_k).view(1, 1, -1, 1)
    k = k.mul_(0.1).add_(ramp * direction / max(direction.norm().item(), 1e-3))
    q = q.mul_(0.1).add_(direction * 2.0)
    return q, k, v


def huge_logits(gen, s: Shapes, fmax: float) -> Values:
    """Logits of 10^4..10^7: products past fp16's 65504 and exp underflow for all but the top keys."""
    q, k, v = random(gen, s, fmax)
    size = min(300.0, math.sqrt(fmax) / 2)
    return q.mul_(size), k.mul_(size), v


def ties(gen, s: Shapes, fmax: float) -> Values:
    """Keys drawn from a pool of three, so many logits tie exactly."""
    q, _, v = random(gen, s, fmax)
    pool = _randn(gen, s.batch, s.heads_kv, 3, s.head_dim) * 2
    pick = torch.randint(0, 3, (s.n_k,), generator=gen)
    return q, pool[:, :, pick], v


def near_ties(gen, s: Shapes, fmax: float) -> Values:
    """One key repeated with tiny perturbations: logits that differ in their last bits."""
    q, k, v = random(gen, s, fmax)
    base = k[:, :, :1] * 2
    return q, base + 1e-3 * k, v


def flat(gen, s: Shapes, fmax: float) -> Values:
    """Tiny logits: nearly uniform attention over every key (accumulation precision on long rows)."""
    q, k, v = random(gen, s, fmax)
    return q.mul_(1e-2), k.mul_(1e-2), v


def flat_large_v(gen, s: Shapes, fmax: float) -> Values:
    """Flat attention over V near 1000: the unnormalised sum of P @ V is about Nk * 1000, past fp16's
    65504 from 66 keys on, while the output stays near 1000 (an accumulator kept in half precision)."""
    q, k, v = flat(gen, s, fmax)
    return q, k, v.mul_(16.0).add_(1000.0)


def coherent_p_rounding(gen, s: Shapes, fmax: float) -> Values:
    """Key 0 on top and every other key one logit level lower, with P = 0.5016 for all of them; V is
    constant along the keys.

    Under the default scale, P = 0.5 + 0.8 * 2^-9 sits just under a bf16 rounding midpoint: rounding P
    more coarsely than the contract allows moves every weight the same way. The errors then add up instead
    of averaging out, and no logit term of the budget covers them (V does not vary along the keys).
    Q and K hold numbers with 11 significant bits, exact in fp16, tf32 and fp32, so the logits are exact
    in any of those. A legal tf32 P moves by at most 0.2 of its own spacing here.
    """
    qs, ks, vs = _qkv_shapes(s)
    exact = lambda x: torch.as_tensor(x, dtype=torch.float32).to(torch.float16).to(torch.float32)  # noqa: E731
    scale = 1.0 / math.sqrt(s.head_dim)  # the default scale regime
    a = exact(math.sqrt(s.head_dim))
    gap = exact(math.log(0.5 + 0.8 * 2.0**-9) / (scale * float(a)))
    q = exact(_randn(gen, *qs))
    q[..., 0] = a
    k = torch.zeros(ks)
    k[:, :, 1:, 0] = gap
    # Q's other columns meet zeros in K: they vary the rows without touching the logits.
    columns = exact(1000.0 + 8.0 * torch.randint(0, 64, (s.head_dim_v,), generator=gen).float())
    v = columns.expand(vs).clone()
    return q, k, v


def cancelling_v(gen, s: Shapes, fmax: float) -> Values:
    """V columns of large opposite values: outputs near zero while the weight scale stays large."""
    q, k, v = random(gen, s, fmax)
    sign = torch.where(torch.arange(s.n_k) % 2 == 0, 1.0, -1.0).view(1, 1, -1, 1)
    return q.mul_(0.1), k.mul_(0.1), v.abs_().add_(64.0).mul_(sign)


def positive_v(gen, s: Shapes, fmax: float) -> Values:
    """V far from zero and all positive: outputs near 100, a matmul-shaped error."""
    q, k, v = random(gen, s, fmax)
    return q, k, v.add_(100.0)


def subnormal_p(gen, s: Shapes, fmax: float) -> Values:
    """Logit gaps of 8..25 below the max: unnormalised P lands in fp16's subnormal range."""
    q, k, v = random(gen, s, fmax)
    direction = torch.ones(1, 1, 1, s.head_dim) / math.sqrt(s.head_dim)
    spread = torch.rand(s.batch, s.heads_kv, s.n_k, 1, generator=gen) * 25.0
    spread[:, :, 0] = 0.0
    k = (-spread) * direction * math.sqrt(s.head_dim)
    q = torch.ones(s.batch, s.heads_q, s.n_q, s.head_dim) / math.sqrt(s.head_dim)
    return q, k, v


def tiny_values(gen, s: Shapes, fmax: float) -> Values:
    """V near 1e-5: fp16 outputs are subnormal and their rounding is absolute."""
    q, k, v = random(gen, s, fmax)
    return q, k, v.mul_(1e-5)


VALUE_REGIMES: dict[str, Callable[..., Values]] = {
    f.__name__: f for f in (random, peaked, growing_max, huge_logits, ties, near_ties, flat, flat_large_v,
                            coherent_p_rounding, cancelling_v, positive_v, subnormal_p, tiny_values)
}


def make_values(regime: str, *, shapes: Shapes, dtype, seed: int) -> Values:
    """q, k, v of the named regime, rounded to ``dtype`` (values representable, so exact inputs)."""
    if regime not in VALUE_REGIMES:
        raise InvalidArgument("regime", regime, "unknown value regime",
                              f"Use one of {sorted(VALUE_REGIMES)}.")
    fmt = format_of(dtype)
    if not drawn_by_entry(shapes):
        return _rounded(VALUE_REGIMES[regime](seeded(seed), shapes, fmt.max_value), fmt)
    one = dataclasses.replace(shapes, batch=1)
    values = None
    for b in range(shapes.batch):
        entry = _rounded(VALUE_REGIMES[regime](seeded(entry_seed(seed, b)), one, fmt.max_value), fmt)
        if values is None:
            values = tuple(torch.empty((shapes.batch, *t.shape[1:]), dtype=t.dtype) for t in entry)
        for out, t in zip(values, entry):
            out[b] = t[0]
    return values


def _rounded(values: Values, fmt) -> Values:
    values = list(values)
    for i, t in enumerate(values):  # one at a time, each float32 tensor let go once rounded: K and V may be 8 GiB
        t = t.clamp_(-fmt.max_value, fmt.max_value) if t.is_contiguous() else t.clamp(-fmt.max_value, fmt.max_value)
        values[i] = t = t.to(fmt.dtype).contiguous()
    return tuple(values)


# --- masks ------------------------------------------------------------------------------------------

def _mask_random(gen, s: Shapes) -> torch.Tensor:
    return torch.rand(s.batch, s.heads_q, s.n_q, s.n_k, generator=gen) < 0.7


def _mask_fully_masked_rows(gen, s: Shapes) -> torch.Tensor:
    """A random mask where about a quarter of the rows see no key at all."""
    m = _mask_random(gen, s)
    dead = torch.rand(s.batch, s.heads_q, s.n_q, 1, generator=gen) < 0.25
    return m & ~dead


def _mask_key_padding_right(gen, s: Shapes) -> torch.Tensor:
    lengths = torch.randint(1, s.n_k + 1, (s.batch, 1, 1, 1), generator=gen)
    return (torch.arange(s.n_k).view(1, 1, 1, -1) < lengths).expand(-1, 1, 1, -1)


def _mask_key_padding_left(gen, s: Shapes) -> torch.Tensor:
    lengths = torch.randint(1, s.n_k + 1, (s.batch, 1, 1, 1), generator=gen)
    return (torch.arange(s.n_k).view(1, 1, 1, -1) >= s.n_k - lengths).expand(-1, 1, 1, -1)


# The masks the features' restrictions give (each feature's ``masks``), as boolean masks.
FEATURE_MASKS: dict[str, Callable] = {name: draw for f in REGISTRY for name, draw in f.masks.items()}

MASK_REGIMES: dict[str, Callable | None] = {
    "none": None,
    "random": _mask_random,
    "fully_masked_rows": _mask_fully_masked_rows,
    "key_padding_right": _mask_key_padding_right,
    "key_padding_left": _mask_key_padding_left,
    **FEATURE_MASKS,
}


def make_mask(regime: str, *, shapes: Shapes, seed: int) -> torch.Tensor | None:
    """The boolean mask of the named mask regime (``None`` for ``"none"``)."""
    if regime not in MASK_REGIMES:
        raise InvalidArgument("mask regime", regime, "unknown mask regime",
                              f"Use one of {sorted(MASK_REGIMES)}.")
    fn = MASK_REGIMES[regime]
    if fn is None:
        return None
    return fn(seeded(int(seed) + 1), shapes).contiguous()


SCALE_REGIMES = ("default", "negative", "tiny", "huge")


def make_scale(regime: str, *, head_dim: int, base: float | None = None) -> float:
    """The softmax scale: ``base`` (None: 1/sqrt(D)), or negative, tiny or huge versions of it."""
    base = 1.0 / math.sqrt(head_dim) if base is None else base
    table = {"default": base, "negative": -base, "tiny": base * 1e-4, "huge": base * 64.0}
    if regime not in table:
        raise InvalidArgument("scale regime", regime, "unknown scale regime",
                              f"Use one of {list(table)}.")
    return table[regime]


# --- upstream gradients (dO) for the backward pass ---------------------------------------------------
# Each takes the forward output O (B, Hq, Nq, Dv; exact or the kernel's, any float dtype, NaN on rows
# with no visible key) and returns dO before its rounding to the inputs' dtype.

def _do_random(gen, out: torch.Tensor, fmax: float) -> torch.Tensor:
    """Standard normal dO: the case every test suite covers."""
    return _randn(gen, *out.shape)


def _do_aligned(gen, out: torch.Tensor, fmax: float) -> torch.Tensor:
    """dO along O itself: D_i = dO_i . O_i is as large as it gets, so dP - D and dS cancel."""
    o = torch.nan_to_num(out.double(), nan=0.0)
    return o * (1 + 2.0**-6 * _randn(gen, *out.shape))


def _do_huge(gen, out: torch.Tensor, fmax: float) -> torch.Tensor:
    """dO near the square root of the dtype's largest value: dP and D far past fp16's range in their
    fp32 accumulators, gradients that stay representable."""
    return _randn(gen, *out.shape) * math.sqrt(fmax)


def _do_zero_rows(gen, out: torch.Tensor, fmax: float) -> torch.Tensor:
    """About half the rows of dO are zero: their dS must be exactly zero, whatever the kernel's D."""
    keep = torch.rand(*out.shape[:-1], 1, generator=gen) < 0.5
    return _randn(gen, *out.shape) * keep


def _do_sparse(gen, out: torch.Tensor, fmax: float) -> torch.Tensor:
    """A few non-zero entries of mixed size: dV and dK dominated by single rows."""
    keep = torch.rand(*out.shape, generator=gen) < 0.05
    return _randn(gen, *out.shape) * keep * torch.exp2(torch.randint(-8, 9, out.shape, generator=gen).double())


UPSTREAM_REGIMES: dict[str, Callable] = {
    "random": _do_random,
    "aligned": _do_aligned,
    "huge": _do_huge,
    "zero_rows": _do_zero_rows,
    "sparse": _do_sparse,
}


def make_upstream(regime: str, *, out: torch.Tensor, dtype, seed: int) -> torch.Tensor:
    """dO of the named regime for the forward output ``out``, rounded to ``dtype`` (exact inputs)."""
    if regime not in UPSTREAM_REGIMES:
        raise InvalidArgument("upstream regime", regime, "unknown dO regime", f"Use one of {sorted(UPSTREAM_REGIMES)}.")
    fmt = format_of(dtype)
    gen = torch.Generator().manual_seed(int(seed) + 2)
    do = UPSTREAM_REGIMES[regime](gen, out.detach().cpu(), fmt.max_value)
    return do.clamp(-fmt.max_value, fmt.max_value).to(fmt.dtype).contiguous()
