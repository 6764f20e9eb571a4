"""The MLA form: multi-head latent attention's one cached row per token, K's D columns with V its first
``kv_lora_rank`` (:mod:`flashcheck.contract.mla` gives the convention), on the dense or the paged form. A spec
declares it with ``mla``; its cases are decode steps (1 to 4 queries a sequence, up to 128 query heads on one KV
head) whose V is K's latent bit for bit, at the model's scale (DeepSeek V3's), never 1/sqrt(D). A value regime of
its own (``heavy_rope``) makes the rope columns, which V must not read, dwarf the latent; four more set the two parts
of each logit against each other: ``rope_dominant``, ``latent_dominant``, ``cancelling_parts`` and
``huge_rope_logits``. Each changes the drawn q and k in their dtype, within a quarter of its range; V is cut from
K after it, so it stays K's latent bit for bit."""

from __future__ import annotations

import math

import torch

from ..contract.formats import format_of
from ..contract.head_dims import HeadDimPair
from ..contract.mla import MAX_QUERIES, MAX_QUERY_HEADS, MODEL_SCALE
from .forms import Form, FormDraws


def _draws(spec) -> FormDraws | None:
    cache = spec.mla
    if cache is None:
        return None
    return FormDraws(heads_kv=1, max_query_heads=MAX_QUERY_HEADS, max_queries=MAX_QUERIES,
                     head_dims=(HeadDimPair(cache.head_dim, cache.head_dim_v),), shared_kv=True,
                     base_scale=MODEL_SCALE)


# The rope columns as poison for a V view that reads past the latent: K's 2^e times larger, Q's 2^-e times, so that
# every product, and the logits, stay as they were (where nothing underflows) while the rope dwarfs the latent.
HEAVY_EXPONENT = 8


def _heavy_rope(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shapes) -> tuple:
    rope = slice(shapes.head_dim_v, None)
    top = float(k[..., rope].abs().max()) if k.numel() else 0.0
    room = math.floor(math.log2(format_of(k).max_value / 4 / top)) if top > 0 else HEAVY_EXPONENT
    e = min(HEAVY_EXPONENT, room)  # K's rope stays a quarter of the dtype's range away from its top
    if e < 1:
        return q, k, v
    q, k = q.clone(), k.clone()
    k[..., rope] *= 2.0 ** e
    q[..., rope] *= 2.0 ** -e
    return q, k, v


def _room(t: torch.Tensor, wanted: int) -> int:
    """The largest e <= ``wanted`` for which t * 2^e stays a quarter of t's dtype's range away from its top."""
    top = float(t.abs().max()) if t.numel() else 0.0
    return wanted if top == 0 else min(wanted, math.floor(math.log2(format_of(t).max_value / 4 / top)))


# How far the tilted regimes set one part of the logits above the other: 2^8, half of it by raising the one part
# of q (where the dtype has room), the rest by lowering the other.
TILT_EXPONENT = 8


def _tilt(q: torch.Tensor, up: slice, down: slice) -> torch.Tensor:
    """q with its columns ``up`` raised and ``down`` lowered, 2^TILT_EXPONENT apart (powers of two: exact where
    nothing underflows)."""
    q = q.clone()
    e = max(0, _room(q[..., up], TILT_EXPONENT // 2))
    q[..., up] *= 2.0 ** e
    q[..., down] *= 2.0 ** (e - TILT_EXPONENT)
    return q


def _rope_dominant(q, k, v, shapes) -> tuple:
    """The rope part of each logit some 2^8 times the latent's (q's rope columns raised, its latent lowered): a
    kernel that drops the rope part, reads it from the wrong columns or the wrong row, or scales it apart from the
    latent's gets logits of the wrong keys, which the latent part cannot hide."""
    return _tilt(q, slice(shapes.head_dim_v, None), slice(None, shapes.head_dim_v)), k, v


def _latent_dominant(q, k, v, shapes) -> tuple:
    """The latent part of each logit some 2^8 times the rope's: the logits are the latent's dot of 512 terms, so a
    kernel that reads only some of the latent columns, or sums them with too little precision (in 16 bits, or in
    tiles added out of order with a lost tile), is measured on that dot alone, the rope part no longer covering
    its error."""
    return _tilt(q, slice(None, shapes.head_dim_v), slice(shapes.head_dim_v, None)), k, v


# How far apart the cancelling parts and what is left of them are: the latent's first rope_dim columns raised by
# 2^CANCEL_UP, the rest of it lowered by 2^-CANCEL_DOWN.
CANCEL_UP, CANCEL_DOWN = 4, 5


def _cancelling_parts(q, k, v, shapes) -> tuple:
    """Each logit a small difference of two large parts: K's rope columns a copy of its first latent columns and
    q's rope the negation of q's first latent columns (raised), so the rope part cancels that much of the latent
    part exactly, leaving the (lowered) rest of the latent's dot, some 2^7 times smaller than either part. A kernel
    that computes either part, or their sum, in low precision (fp16 or bf16 partial sums, a rounded rope product)
    makes an error of the large parts' size in a small logit."""
    rank = shapes.head_dim_v
    m = min(shapes.head_dim - rank, rank)  # the rope columns that copy latent ones (all, for 512 + 64)
    q, k = q.clone(), k.clone()
    k[..., rank:rank + m] = k[..., :m]
    q[..., :m] *= 2.0 ** max(0, _room(q[..., :m], CANCEL_UP))
    q[..., m:rank] *= 2.0 ** -CANCEL_DOWN
    q[..., rank:rank + m] = -q[..., :m]
    q[..., rank + m:] = 0.0
    return q, k, v


# The rope columns of q and k are each raised by up to 2^7, as the huge_logits value regime raises the whole of q
# and k by 300 (sqrt(fmax) / 2 for fp16: 2^7).
HUGE_EXPONENT = 7


def _huge_rope_logits(q, k, v, shapes) -> tuple:
    """Logits of 10^3 and more made by the rope part alone (q's and K's rope columns raised, each within a quarter
    of the dtype's range and sqrt(max) / 2): a kernel that finds the running max from the latent part only, forms
    the rope product in 16 bits (where it overflows), or sums the parts before subtracting the max in low
    precision, overflows exp or loses every key but the top one."""
    rope = slice(shapes.head_dim_v, None)
    limit = math.floor(math.log2(math.sqrt(format_of(k).max_value) / 2))
    e = max(0, min(_room(q[..., rope], HUGE_EXPONENT), _room(k[..., rope], HUGE_EXPONENT), limit))
    q, k = q.clone(), k.clone()
    q[..., rope] *= 2.0 ** e
    k[..., rope] *= 2.0 ** e
    return q, k, v


FORM = Form("mla", draws=_draws, values={"none": None, "heavy_rope": _heavy_rope, "rope_dominant": _rope_dominant,
                                         "latent_dominant": _latent_dominant, "cancelling_parts": _cancelling_parts,
                                         "huge_rope_logits": _huge_rope_logits})
