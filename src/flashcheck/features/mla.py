"""The MLA form: multi-head latent attention's one cached row per token, K's D columns with V its first
``kv_lora_rank`` (:mod:`flashcheck.contract.mla` gives the convention), on the dense or the paged form. A spec
declares it with ``mla``; its cases are decode steps (1 to 4 queries a sequence, up to 128 query heads on one KV
head) whose V is K's latent bit for bit, at the model's scale (DeepSeek V3's), never 1/sqrt(D)."""

from __future__ import annotations

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


FORM = Form("mla", draws=_draws)
