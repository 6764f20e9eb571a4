"""``torch:sparse-varlen``, ``torch:sparse-paged`` and ``torch:mla-sparse``: index sets
(:mod:`flashcheck.contract.key_sets`) on the serving forms, in float32 torch, the references of that composition.

Each entry of a list is a position in its query's own sequence, 0 to the sequence's key count - 1 (-1 padding, an
index at or past the count masked). The kernel maps each position to its row in the form's storage (the sequence's
offset in the packed k, or its page through the block table), gathers the listed rows and attends them, sequence by
sequence:

- ``torch:sparse-varlen``: ``kernel(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
  causal, indices)``, ``indices`` (total_q, Hkv or 1, topk) packed as q;
- ``torch:sparse-paged``: ``kernel(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal, indices)``,
  ``indices`` (B, Nq, Hkv or 1, topk) laid out as q;
- ``torch:mla-sparse``: DeepSeek V3.2's sparse MLA decode, ``kernel(q, kv_cache, *, block_table, cache_seqlens,
  scale, causal, indices)`` on MLA's one cached row (:mod:`flashcheck.contract.mla`), ``indices`` (B, Nq, 1, topk);
  each logit two fp32 dots summed (the latent's and the rope's), V the row's latent.

A repeated key counts once; causal alignment is each sequence's own (bottom-right). Logits, max, sum and normaliser
in fp32, rounded once to the input's dtype. Their planted bugs (:data:`flashcheck.kernels.planted.SPARSE_VARLEN`,
:data:`~flashcheck.kernels.planted.SPARSE_PAGED`) misread the positions as serving kernels can.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..contract.key_sets import KeySets
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .mla import PAGE_SIZES
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON
from .sparse import CHUNK_ELEMENTS, first_of_each, row_weights, valid_entries

__all__ = ["make_sparse_serving_kernel"]


@dataclass(frozen=True)
class Storage:
    """Where one sequence's keys lie: ``k`` and ``v`` (rows, Hkv, D or Dv) flat fp32, ``rows(positions)`` the row
    of each position of the sequence, ``k_len`` its key count and ``bound`` the count its lists are masked
    against (``k_len``, but for a planted bug)."""

    k: torch.Tensor
    v: torch.Tensor
    rows: Callable
    k_len: int
    bound: int


def _shown(idx: torch.Tensor, causal: str, first: int, n_q: int, k_len: int) -> torch.Tensor:
    """Which entries (Hs, R, topk) of query rows ``first``... the causal alignment shows, on the sequence's own
    lengths."""
    i = first + torch.arange(idx.shape[1], device=idx.device).view(1, -1, 1)
    if causal == "bottom_right":
        return idx <= i + (k_len - n_q)
    if causal == "top_left":
        return idx <= i
    return torch.ones_like(idx, dtype=torch.bool)


def _logits(q: torch.Tensor, kg: torch.Tensor, rank: int | None) -> torch.Tensor:
    """q (Hkv, G, R, D) against the gathered keys (Hkv, R, topk, D): one fp32 dot, or MLA's two (latent, rope)."""
    if rank is None:
        return torch.einsum("kgrd,krtd->kgrt", q, kg)
    return (torch.einsum("kgrd,krtd->kgrt", q[..., :rank], kg[..., :rank])
            + torch.einsum("kgrd,krtd->kgrt", q[..., rank:], kg[..., rank:]))


def _sequence(q: torch.Tensor, idx: torch.Tensor, keys: Storage, *, scale, causal, rank, mutant):
    """One sequence: q (R, Hq, D), its lists (R, Hs, topk); out (R, Hq, Dv) and lse (Hq, R), fp32."""
    n_q, heads_q = q.shape[0], q.shape[1]
    if keys.k.shape[0] == 0:  # no key in the whole batch: every row empty
        return q.new_zeros(n_q, heads_q, keys.v.shape[-1], dtype=torch.float32), q.new_full(
            (heads_q, n_q), -float("inf"), dtype=torch.float32)
    heads_kv, width = keys.k.shape[1], idx.shape[-1] * (keys.k.shape[-1] + keys.v.shape[-1])
    step = max(1, CHUNK_ELEMENTS // max(1, heads_kv * width))
    outs, lses = [], []
    for r in range(0, n_q, step):
        o, s = _rows(q[r:r + step].transpose(0, 1), idx[r:r + step].transpose(0, 1).long(), keys, first=r,
                     n_q=n_q, scale=scale, causal=causal, rank=rank, mutant=mutant)
        outs.append(o.reshape(heads_q, -1, o.shape[-1]).transpose(0, 1))
        lses.append(s.reshape(heads_q, -1))
    return torch.cat(outs, 0), torch.cat(lses, 1)


def _rows(q, idx, keys: Storage, *, first, n_q, scale, causal, rank, mutant):
    """Query rows ``first``... of a sequence: q (Hq, R, D), lists (Hs, R, topk); out (Hkv, G, R, Dv), lse."""
    heads_kv = keys.k.shape[1]
    valid = valid_entries(idx, keys.bound, None)
    if mutant == "padding_reads_slot0":
        valid = valid | (idx == -1)
    valid = first_of_each(idx, valid) & _shown(idx, causal, first, n_q, keys.k_len)
    slots = keys.rows(idx.clamp(0, max(keys.bound - 1, 0)))
    if mutant == "padding_reads_slot0":  # -1 taken as a slot of the pool: its first
        slots = torch.where(idx == -1, 0, slots)
    slots = slots.clamp(0, keys.k.shape[0] - 1).expand(heads_kv, -1, -1)
    head = torch.arange(heads_kv, device=q.device).view(-1, 1, 1)
    valid = valid.expand(heads_kv, -1, -1)
    kg = keys.k[slots, head]  # (Hkv, R, topk, D)
    vg = torch.where(valid[..., None], keys.v[slots, head], 0.0)  # an entry never read: a sequence without keys
    w = row_weights(_logits(q.float().unflatten(0, (heads_kv, -1)), kg, rank) * scale, valid.unsqueeze(1))
    return w.normalised(torch.einsum("kgrt,krtd->kgrd", w.p, vg))


def _varlen(mutant: str | None):
    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none",
                  indices):
        cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        flat_k, flat_v = k.float(), v.float()
        out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        lse = torch.full((q.shape[1], q.shape[0]), -float("inf"), device=q.device)
        for b in range(len(cu_q) - 1):
            start, k_len = cu_k[b], cu_k[b + 1] - cu_k[b]
            if cu_q[b + 1] == cu_q[b]:
                continue
            offset = 0 if mutant == "global_positions" else start  # the positions read as rows of the packed k
            bound = max_seqlen_k if mutant == "bounds_by_longest" else k_len
            keys = Storage(flat_k, flat_v, lambda pos, o=offset: pos + o, k_len, bound)
            rows = slice(cu_q[b], cu_q[b + 1])
            o, lse[:, rows] = _sequence(q[rows], indices[rows], keys, scale=scale, causal=causal, rank=None,
                                        mutant=mutant)
            out[rows] = o.to(q.dtype)
        return out, lse

    return attention


def _paged_storage(k_cache, v_cache, table_row, k_len: int, mutant: str | None) -> Storage:
    """A sequence's keys in the page pool, flattened to (num_blocks * page, Hkv, D): a position's row through the
    sequence's row of the block table (or, planted, the pool read in order)."""
    page = k_cache.shape[1]
    flat_k, flat_v = (t.float().flatten(0, 1) for t in (k_cache, v_cache))

    def rows(pos):
        if mutant == "ignores_block_table":
            return pos
        return table_row[pos // page] * page + pos % page

    return Storage(flat_k, flat_v, rows, k_len, k_len)


def _paged(rank: int | None, mutant: str | None):
    def attention(q, k_cache, v_cache=None, *, block_table, cache_seqlens, scale, causal="none", indices):
        v_cache = k_cache[..., :rank] if rank is not None else v_cache  # MLA: V is the row's latent
        out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[-1])
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        for b, k_len in enumerate(cache_seqlens.tolist()):
            keys = _paged_storage(k_cache, v_cache, block_table[b].long(), k_len, mutant)
            o, lse[b] = _sequence(q[b], indices[b], keys, scale=scale, causal=causal, rank=rank, mutant=mutant)
            out[b] = o.to(q.dtype)
        return out, lse

    return attention


NAMES = ("torch:sparse-varlen", "torch:sparse-paged", "torch:mla-sparse")


def make_sparse_serving_kernel(name: str, *, device: str, mutant: str | None = None) -> Kernel:
    """One of :data:`NAMES`, with its planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    mla = name == "torch:mla-sparse"
    common = dict(key_sets=KeySets(), causal=("none", "bottom_right"), fully_masked_rows="zero", precision="upcast",
                  devices=(device,), nan_safe_masking=True, batch_invariant=True)
    if mla:
        spec = KernelSpec(mla=True, form="paged", page_sizes=PAGE_SIZES, **common)
        fn = _paged(spec.mla.kv_lora_rank, mutant)
    else:
        form = name.split("-")[1]
        spec = KernelSpec(form=form, gqa=True, max_head_dim=256, **common)
        fn = _varlen(mutant) if form == "varlen" else _paged(None, mutant)
    fn.__name__ = fn.__qualname__ = name.split(":")[1].replace("-", "_")
    return Kernel(fn, spec, name=f"{name}~{mutant}" if mutant else name)
