"""Multi-head latent attention (MLA) in its absorbed decode form: the convention a spec declares with ``mla``.

Each token caches one row of ``kv_lora_rank + rope_dim`` values (DeepSeek V2/V3, Kimi K2: 512 + 64 = 576), the
latent and its rope part. K is that row, one head shared by every query head; V is a view of the same row's first
``kv_lora_rank`` columns, never a tensor of its own. FlashMLA's conventions, which flashcheck follows:

- dense: ``kernel(q, kv, *, scale, causal, ...)``, q (B, Hq, Nq, D), kv (B, 1, Nk, D), D = kv_lora_rank +
  rope_dim; it returns out (B, Hq, Nq, kv_lora_rank), or ``(out, lse)`` with lse (B, Hq, Nq);
- paged: ``kernel(q, kv_cache, *, block_table, cache_seqlens, scale, causal, ...)``, q (B, Nq, Hq, D), kv_cache
  (num_blocks, page_size, 1, D); out (B, Nq, Hq, kv_lora_rank), lse (B, Hq, Nq).

The scale is the model's (1/sqrt(192) times YaRN's factor for DeepSeek V3), passed explicitly: the cached row's
576 columns are no head dim of the model. The logical problem flashcheck judges is plain attention with K of D
columns and V = K[..., :kv_lora_rank], bit for bit, so the oracle and the budget need nothing of their own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import InvalidArgument
from .counts import check_count
from .declared import declared_record
from .head_dims import MAX_HEAD_DIM

__all__ = ["DEEPSEEK_V3", "MAX_QUERIES", "MAX_QUERY_HEADS", "MODEL_SCALE", "LatentCache", "implied_fields",
           "latent_cache"]

# Decode shapes: up to 128 query heads on the one KV head, 1 to 4 queries a sequence (multi-token prediction).
MAX_QUERY_HEADS = 128
MAX_QUERIES = 4
# DeepSeek V3's softmax scale: its un-absorbed head dim 192 (128 + rope 64), times YaRN's mscale squared
# (0.1 ln(40) + 1 at its factor 40), as its attention layer computes it.
MODEL_SCALE = 192 ** -0.5 * (0.1 * math.log(40.0) + 1.0) ** 2

_FIX = ("Declare mla=True (DeepSeek's 512 + 64), or mla=flashcheck.LatentCache(kv_lora_rank=..., rope_dim=...) "
        "with whole numbers whose sum is at most {}.".format(MAX_HEAD_DIM))


@dataclass(frozen=True)
class LatentCache:
    """The cached row of MLA: ``kv_lora_rank`` latent columns (V's), then ``rope_dim`` rope columns."""

    kv_lora_rank: int = 512
    rope_dim: int = 64

    def __post_init__(self):
        check_count("kv_lora_rank", self.kv_lora_rank, fix=_FIX)
        check_count("rope_dim", self.rope_dim, fix=_FIX)
        if self.head_dim > MAX_HEAD_DIM:
            raise InvalidArgument("mla", self.as_dict(), f"kv_lora_rank + rope_dim = {self.head_dim} is above "
                                  f"flashcheck's head dim limit {MAX_HEAD_DIM}", _FIX)

    @property
    def head_dim(self) -> int:
        """D: Q's and K's head dim, the whole cached row."""
        return self.kv_lora_rank + self.rope_dim

    @property
    def head_dim_v(self) -> int:
        """Dv: V's head dim, the latent."""
        return self.kv_lora_rank

    def as_dict(self) -> dict:
        return {"kv_lora_rank": self.kv_lora_rank, "rope_dim": self.rope_dim}

    def unsupported(self, heads_kv: int, head_dim: int, head_dim_v: int) -> str | None:
        """Why a case of these shapes is no MLA problem of this row, or None."""
        if heads_kv != 1:
            return f"MLA caches one KV head, not {heads_kv}"
        if (head_dim, head_dim_v) != (self.head_dim, self.head_dim_v):
            return (f"head dims D={head_dim}, Dv={head_dim_v}, not the cached row's D={self.head_dim}, "
                    f"Dv={self.head_dim_v}")
        return None


DEEPSEEK_V3 = LatentCache()


def latent_cache(value) -> LatentCache | None:
    """A spec's ``mla`` as a :class:`LatentCache`: None or False (no MLA), True (DeepSeek V3's 512 + 64), a record,
    or a mapping of its two fields."""
    return declared_record("mla", value, LatentCache, DEEPSEEK_V3, _FIX)


def implied_fields(cache: LatentCache, *, head_dims) -> dict:
    """The spec fields the cached row fixes: D alone, Dv != D, one KV head for many query heads. A ``head_dims``
    other than D is an :class:`InvalidArgument` naming it."""
    if head_dims is not None and tuple(head_dims) != (cache.head_dim,):
        raise InvalidArgument("head_dims", head_dims, f"mla fixes D = kv_lora_rank + rope_dim = {cache.head_dim}",
                              f"Leave head_dims out (mla sets it), or declare head_dims=({cache.head_dim},).")
    return {"head_dims": (cache.head_dim,), "max_head_dim": cache.head_dim, "min_head_dim": 1,
            "dv_equals_d": False, "gqa": True, "mla": cache}
