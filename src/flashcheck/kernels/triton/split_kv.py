"""``flashcheck:triton-split-kv``: split-KV decoding over a paged KV cache, in two Triton kernels.

The first kernel runs one program per (query tile, head, sequence, split): split s of a sequence of n keys
takes keys n s / S to n (s + 1) / S through the block table (as ``flashcheck:triton-paged`` reads them) and
writes its partial state, o_s in fp32 and lse_s in natural log; an empty split writes (0, -inf). The second
merges each row's states (a program per tile of a sequence's rows, every head's) relative to the largest lse_s
(rows whose splits are all empty give 0 and -inf) and rounds once to the inputs' dtype. Its planted bugs are ``torch:split-kv``'s (:mod:`flashcheck.kernels.planted`),
switches of the first kernel (``EMPTY_NAN``, ``BASE2``).
"""

from __future__ import annotations

import torch

from ...contract.spec import Kernel
from ...errors import InvalidArgument
from ..split_kv import SPLIT_COUNTS
from .online import BLOCK_M, LN2, finish
from .paged import RUNTIME_SIZES, PagedArgs, attend_pages, paged_spec
from .runtime import import_triton

__all__ = ["NAME", "check_splits", "make_split_kv_kernel", "merge_states"]

NAME = "flashcheck:triton-split-kv"

triton, tl = import_triton()


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _partials(Q, K, V, O_S, LSE_S, table, seqlens, scale_log2, n_q, heads, batch, splits, page_size, sqb, sqm,
              sqh, skb, sks, skh, svb, svs, svh, stb, GROUP, CAUSAL: tl.constexpr, EMPTY_NAN: tl.constexpr,
              BASE2: tl.constexpr, D, DV, BD: tl.constexpr,
              BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tile, head, which = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    seq, split = which // splits, which % splits
    n_k = tl.load(seqlens + seq)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    q = tl.load(Q + seq.to(tl.int64) * sqb + rows[:, None] * sqm + head * sqh + dims[None, :],
                mask=(rows[:, None] < n_q) & (dims[None, :] < D), other=0.0)
    kv_head = head // GROUP
    m_i, l_i, acc = attend_pages(q, K, V, table + seq * stb, rows, n_k * split // splits,
                                 n_k * (split + 1) // splits, n_q, n_k, page_size, skb, sks, kv_head * skh, svb, svs,
                                 kv_head * svh, scale_log2, CAUSAL, False, D, DV, BD, BDV, BLOCK_M, BLOCK_N)
    out, lse2 = finish(m_i, l_i, acc)
    if EMPTY_NAN:  # a planted bug: 0 / 0 on a row of the split that sees no key
        out = acc / l_i[:, None]
    state = ((split * batch + seq) * heads + head).to(tl.int64) * n_q + rows
    tl.store(O_S + state[:, None] * DV + dims_v[None, :], out, mask=(rows[:, None] < n_q) & (dims_v[None, :] < DV))
    tl.store(LSE_S + state, lse2 if BASE2 else lse2 * LN2, mask=rows < n_q)


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def merge_states(O_S, LSE_S, O, LSE, n_q, heads, batch, splits, sob, som, soh, DV, BDV: tl.constexpr,
                 BLOCK_M: tl.constexpr):
    """Each row's partial states merged relative to the largest lse_s into O (b, i, h) and LSE (b, h, i); rows
    whose splits are all empty give 0 and -inf. A program merges a tile of a sequence's rows r = h n_q + i (every
    head's), whose states (o_s fp32 and lse_s in natural log) lie at ``(s * batch + b) * heads * n_q + r``."""
    tile, seq = tl.program_id(0), tl.program_id(1)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    head, pos = rows // n_q, rows % n_q
    dims_v = tl.arange(0, BDV)
    row_ok = rows < heads * n_q
    keep = row_ok[:, None] & (dims_v[None, :] < DV)
    first = seq.to(tl.int64) * heads * n_q + rows
    stride = batch * heads * n_q  # from one split's states to the next
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in range(0, splits):
        m = tl.maximum(m, tl.load(LSE_S + first + s * stride, mask=row_ok, other=float("-inf")))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], tl.float32)
    for s in range(0, splits):
        w = tl.exp(tl.load(LSE_S + first + s * stride, mask=row_ok, other=float("-inf")) - m_safe)
        o_s = tl.load(O_S + (first + s * stride)[:, None] * DV + dims_v[None, :], mask=keep, other=0.0)
        total += w
        acc += w[:, None] * o_s
    out = acc / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(O + seq.to(tl.int64) * sob + pos[:, None] * som + head[:, None] * soh + dims_v[None, :],
             out.to(O.dtype.element_ty), mask=keep)
    lse = tl.where(total > 0, m_safe + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    tl.store(LSE + first, lse, mask=row_ok)


def check_splits(num_splits) -> None:
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise InvalidArgument("num_splits", num_splits, "expected a positive int",
                              f"Pass num_splits=1 or more (the spec judges {SPLIT_COUNTS}).")


def make_split_kv_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
        check_splits(num_splits)
        a = PagedArgs(q, k_cache, v_cache, block_table, cache_seqlens, scale)
        out = torch.empty(a.batch, a.n_q, a.heads, a.dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(a.batch, a.heads, a.n_q, dtype=torch.float32, device=q.device)
        if a.empty():
            return out, lse
        o_s = torch.empty(num_splits, a.batch, a.heads, a.n_q, a.dv, dtype=torch.float32, device=q.device)
        lse_s = torch.empty(num_splits, a.batch, a.heads, a.n_q, dtype=torch.float32, device=q.device)
        shape = (a.n_q, a.heads, a.batch, num_splits)
        _partials[(a.tiles, a.heads, a.batch * num_splits)](
            q, k_cache, v_cache, o_s, lse_s, block_table, cache_seqlens, a.scale_log2, *shape, a.page_size,
            *a.strides, a.table_stride, CAUSAL=causal == "bottom_right", EMPTY_NAN=mutant == "empty_split_nan",
            BASE2=mutant == "lse_base2", **a.sizes)
        merge_states[(triton.cdiv(a.heads * a.n_q, BLOCK_M), a.batch)](
            o_s, lse_s, out, lse, *shape, *out.stride()[:3], DV=a.dv, BDV=a.sizes["BDV"], BLOCK_M=BLOCK_M)
        return out, lse

    attention.__name__ = attention.__qualname__ = "triton_split_kv"
    name = NAME + (f"~{mutant}" if mutant else "")
    return Kernel(attention, paged_spec(device, num_splits=SPLIT_COUNTS), name=name)
