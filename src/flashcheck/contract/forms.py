"""Serving forms: how a kernel receives a batch of logical attention problems, one per sequence.

``form="dense"`` (the default) is the calling convention of :mod:`flashcheck.contract.spec`. The serving
forms follow flash-attention's conventions:

- ``form="varlen"``: ``kernel(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
  causal, ...)`` with q (total_q, Hq, D), k and v (total_k, Hkv, D) packed sequence after sequence,
  ``cu_seqlens_*`` int32 (B + 1,) offsets starting at 0, ``max_seqlen_*`` ints at least the longest
  sequence; returns out (total_q, Hq, Dv), or ``(out, lse)`` with lse (Hq, total_q). A kernel whose spec
  declares ``seqused_k`` may also receive ``seqused_k``, int32 (B,): sequence b uses only the first
  ``seqused_k[b]`` of the keys from ``cu_seqlens_k[b]`` to ``cu_seqlens_k[b + 1]`` (the rest hold poison).
- ``form="paged"``: ``kernel(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal, ...)`` with
  q (B, Nq, Hq, D), caches (num_blocks, page_size, Hkv, D), ``block_table`` int32 (B, max_blocks) (the
  pages of sequence b in order), ``cache_seqlens`` int32 (B,) keys per sequence; returns out (B, Nq, Hq, Dv),
  or ``(out, lse)`` with lse (B, Hq, Nq).

Causal alignment, windows and chunks apply per sequence to its own lengths (bottom-right is
flash-attention's). A sequence with no keys has only empty rows (the spec's ``fully_masked_rows``). The
variant keywords are those of the dense form; ``alibi_slopes`` of shape (B, Hq) has one row per sequence.
"""

from __future__ import annotations

__all__ = ["FORMS", "SERVING_FORMS", "output_shapes"]

FORMS = ("dense", "varlen", "paged")
SERVING_FORMS = FORMS[1:]


def output_shapes(form: str, *, batch: int, heads_q: int, n_q: int, head_dim_v: int,
                  total_q: int) -> tuple[tuple, tuple]:
    """``(out shape, lse shape)`` a kernel of ``form`` returns (``total_q``: the packed query count)."""
    if form == "varlen":
        return (total_q, heads_q, head_dim_v), (heads_q, total_q)
    if form == "paged":
        return (batch, n_q, heads_q, head_dim_v), (batch, heads_q, n_q)
    return (batch, heads_q, n_q, head_dim_v), (batch, heads_q, n_q)
