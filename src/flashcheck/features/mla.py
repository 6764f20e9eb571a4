"""The MLA form: multi-head latent attention's one cached row per token, K's D columns with V its first
``kv_lora_rank`` (:mod:`flashcheck.contract.mla` gives the convention), on the dense or the paged form. A spec
declares it with ``mla``; its cases are decode steps (1 to 4 queries a sequence, up to 128 query heads on one KV
head) whose V is K's latent bit for bit, at the model's scale (DeepSeek V3's), never 1/sqrt(D). A value regime of
its own (``heavy_rope``) makes the rope columns, which V must not read, dwarf the latent."""

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


FORM = Form("mla", draws=_draws, values={"none": None, "heavy_rope": _heavy_rope})
