"""``flashcheck:triton-paged``: a Triton flash-attention kernel over a paged KV cache with a block table.

One program per (query tile, head, sequence) walks its sequence's keys tile by tile; each key is read from
its own page (``block_table[b, j // page_size]``, slot ``j % page_size``), so a tile may span pages of any
size, 1 included. Loads are masked at the sequence's cache length, scores are in fp32 and base 2 with the
online softmax, P is rounded to the inputs' dtype before P @ V, and causal is bottom-right per sequence.
Its planted bugs are ``torch:paged``'s (:mod:`flashcheck.kernels.planted`), switches of the kernel
(``OFF_BY_ONE``, ``WHOLE_PAGES``).
"""

from __future__ import annotations

import math

import torch

from ...contract.spec import Kernel, KernelSpec
from ...errors import InvalidArgument
from .online import BLOCK_M, BLOCK_N, LN2, finish, gather_pages, online_step, pow2, start_state
from .runtime import import_triton, triton_dtypes

__all__ = ["NAME", "PagedArgs", "attend_pages", "check_table", "make_paged_kernel", "paged_spec"]

NAME = "flashcheck:triton-paged"

MAX_HEAD_DIM = 256  # a (BLOCK_M, 256) fp32 accumulator is the most a tile holds in registers

triton, tl = import_triton()
# Sizes and strides stay runtime values (no specialisation on 1 or on multiples of 16): a campaign draws a new
# shape every case, and one compiled kernel per dtype and power-of-two tile serves them all.
RUNTIME_SIZES = ("scale_log2", "n_q", "heads", "batch", "splits", "page_size", "GROUP", "D", "DV", "sqb", "sqm",
                 "sqh", "skb", "sks", "skh", "svb", "svs", "svh", "sob", "som", "soh", "stb")


@triton.jit
def attend_pages(q, K, V, table_row, rows, lo, hi, n_q, n_k, page_size, skb, sks, k_off, svb, svs, v_off,
                 scale_log2, CAUSAL: tl.constexpr, OFF_BY_ONE: tl.constexpr, D, DV, BD: tl.constexpr,
                 BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax (m, l, acc) of the query tile ``q`` over keys ``lo`` to ``hi`` of a sequence of
    ``n_k`` keys (its causal alignment)."""
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    m_i, l_i, acc = start_state(BLOCK_M, BDV)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k = gather_pages(K, table_row, cols, hi, page_size, skb, sks, k_off, dims, D, OFF_BY_ONE)
        v = gather_pages(V, table_row, cols, hi, page_size, svb, svs, v_off, dims_v, DV, OFF_BY_ONE)
        visible = (cols[None, :] < hi) & (rows[:, None] < n_q)
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))
        m_i, l_i, acc = online_step(q, tl.trans(k), v, visible, m_i, l_i, acc, scale_log2)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _paged_forward(Q, K, V, O, LSE, table, seqlens, scale_log2, n_q, heads, page_size, sqb, sqm, sqh, skb, sks,
                   skh, svb, svs, svh, sob, som, soh, stb, GROUP, CAUSAL: tl.constexpr, OFF_BY_ONE: tl.constexpr,
                   WHOLE_PAGES: tl.constexpr, D, DV, BD: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    tile, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_k = tl.load(seqlens + seq)
    if WHOLE_PAGES:
        n_k = tl.cdiv(n_k, page_size) * page_size
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    q = tl.load(Q + seq.to(tl.int64) * sqb + rows[:, None] * sqm + head * sqh + dims[None, :],
                mask=(rows[:, None] < n_q) & (dims[None, :] < D), other=0.0)
    kv_head = head // GROUP
    m_i, l_i, acc = attend_pages(q, K, V, table + seq * stb, rows, 0, n_k, n_q, n_k, page_size, skb, sks,
                                 kv_head * skh, svb, svs, kv_head * svh, scale_log2, CAUSAL, OFF_BY_ONE, D, DV, BD,
                                 BDV, BLOCK_M, BLOCK_N)
    out, lse2 = finish(m_i, l_i, acc)
    tl.store(O + seq.to(tl.int64) * sob + rows[:, None] * som + head * soh + dims_v[None, :],
             out.to(O.dtype.element_ty), mask=(rows[:, None] < n_q) & (dims_v[None, :] < DV))
    tl.store(LSE + (seq * heads + head) * n_q + rows, lse2 * LN2, mask=rows < n_q)


def _check(q, k_cache, v_cache, block_table, cache_seqlens) -> None:
    """Refuse what the kernels cannot read, naming the argument."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise InvalidArgument(name, tuple(t.shape), "expected a 4-d tensor with a contiguous last dim",
                                  "Pass q (B, Nq, Hq, D) and caches (num_blocks, page_size, Hkv, D), .contiguous().")
    if q.shape[2] % k_cache.shape[2] or k_cache.shape[:3] != v_cache.shape[:3] or q.shape[3] != k_cache.shape[3]:
        raise InvalidArgument("k_cache", tuple(k_cache.shape), f"does not fit q {tuple(q.shape)} and v_cache "
                              f"{tuple(v_cache.shape)}", "Give k and v caches the same pages and Hkv heads, Hkv "
                              "dividing Hq, and k the head dim of q.")
    if max(q.shape[3], v_cache.shape[3]) > MAX_HEAD_DIM:
        raise InvalidArgument("q", tuple(q.shape), f"head dim above {MAX_HEAD_DIM}", f"Use head dims up to "
                              f"{MAX_HEAD_DIM}.")
    check_table(q, block_table, cache_seqlens)


def check_table(q, block_table, cache_seqlens) -> None:
    """Refuse a block table or cache lengths that do not fit q's (B, ...) sequences, naming the argument."""
    for name, t, dims, shape in (("block_table", block_table, 2, "(B, max_blocks)"),
                                 ("cache_seqlens", cache_seqlens, 1, "(B,)")):
        if t.dim() != dims or t.shape[0] != q.shape[0] or t.dtype != torch.int32:
            raise InvalidArgument(name, f"{tuple(t.shape)} {t.dtype}", f"expected int32 {shape} for the "
                                  f"{q.shape[0]} sequences of q", f"Pass {name} as an int32 tensor {shape}.")


class PagedArgs:
    """A paged call's shapes, strides and tile sizes, as the Triton kernels of the paged form take them."""

    def __init__(self, q, k_cache, v_cache, block_table, cache_seqlens, scale):
        _check(q, k_cache, v_cache, block_table, cache_seqlens)
        self.batch, self.n_q, self.heads, self.d = q.shape
        self.page_size, self.dv = k_cache.shape[1], v_cache.shape[3]
        self.scale_log2 = scale / math.log(2)
        self.tiles = max(1, triton.cdiv(self.n_q, BLOCK_M))
        self.strides = (*q.stride()[:3], *k_cache.stride()[:3], *v_cache.stride()[:3])
        self.table_stride = block_table.stride(0)
        self.sizes = dict(GROUP=self.heads // k_cache.shape[2], D=self.d, DV=self.dv, BD=pow2(self.d),
                          BDV=pow2(self.dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)

    def empty(self) -> bool:
        return not (self.batch and self.n_q and self.heads)


def paged_spec(device: str, **promises) -> KernelSpec:
    """The spec of flashcheck's Triton kernels of the paged form (any page size, GQA, Dv != D)."""
    return KernelSpec(form="paged", dtypes=triton_dtypes(device), causal=("none", "bottom_right"), gqa=True,
                      max_head_dim=MAX_HEAD_DIM, dv_equals_d=False, fully_masked_rows="zero", precision="flash",
                      devices=(device,), batch_invariant=True, nan_safe_masking=True, **promises)


def make_paged_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none"):
        a = PagedArgs(q, k_cache, v_cache, block_table, cache_seqlens, scale)
        out = torch.empty(a.batch, a.n_q, a.heads, a.dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(a.batch, a.heads, a.n_q, dtype=torch.float32, device=q.device)
        if not a.empty():
            _paged_forward[(a.tiles, a.heads, a.batch)](
                q, k_cache, v_cache, out, lse, block_table, cache_seqlens, a.scale_log2, a.n_q, a.heads, a.page_size,
                *a.strides, *out.stride()[:3], a.table_stride, CAUSAL=causal == "bottom_right",
                OFF_BY_ONE=mutant == "page_off_by_one", WHOLE_PAGES=mutant == "ignores_cache_len", **a.sizes)
        return out, lse

    attention.__name__ = attention.__qualname__ = "triton_paged"
    return Kernel(attention, paged_spec(device), name=NAME + (f"~{mutant}" if mutant else ""))
