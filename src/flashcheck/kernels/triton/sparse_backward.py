"""The backward pass of ``flashcheck:triton-sparse``: one Triton kernel, the forward's layout (one program per
query row and block of the query heads sharing a K/V head), its lists read by the very same code
(:func:`.sparse_keys.listed_keys`).

With the forward's lse (natural log), its rounded output O and D_i = dO_i . O_i (fp32, on the host), each tile of
the row's list:

    P  = exp2(S * log2(e) - lse * log2(e))      recomputed in fp32, 0 where a key is hidden or a repeat
    dP = dO V^T,  dS = P (dP - D)               fp32; dS is kept in fp32, as flashcheck:triton's backward keeps it
    dQ += dS K                                  fp32, stored once per program (times the scale)
    dV[key] += P^T dO,  dK[key] += scale dS^T Q  summed over the block's heads by the matmul, then added into the
                                                 gathered key rows of fp32 buffers with atomic adds

A key is chosen by many queries (every row whose list names it), so its dK and dV are sums over programs: atomic
adds, in whatever order the programs run, hence ``deterministic_backward=False``. Only the keys some head of the
block sees are added to (a dropped repeat of a key adds nothing). The buffers are rounded to the inputs' dtype at
the end. The planted bug ``dk_written_not_added`` stores instead of adding: the last program to write a key wins.
"""

from __future__ import annotations

import math

import torch

from .runtime import import_triton
from .sparse_keys import CheckedCall, SparseArgs, listed_keys, switches, visible_keys

__all__ = ["add_rows", "gradient_buffers", "sparse_backward"]

triton, tl = import_triton()
RUNTIME_SIZES = ("scale", "scale_log2", "n_q", "n_k", "topk", "heads_kv", "group", "causal_offset", "D", "DV",
                 "sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som", "slb", "slh",
                 "sib", "sih", "sim", "smb", "smh", "smm", "smn", "sdb", "sdh", "sdm")


@triton.jit
def add_rows(base, key, dims, width, read, value, ATOMIC: tl.constexpr):
    """Add ``value`` (BLOCK_N, BW) into the rows ``key`` of an fp32 buffer, the keys ``read`` only; without
    ``ATOMIC`` (the planted bug) store it."""
    where = base + key[:, None] * width + dims[None, :]
    keep = read[:, None] & (dims[None, :] < width)
    if ATOMIC:
        tl.atomic_add(where, value, mask=keep)
    else:
        tl.store(where, value, mask=keep)


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _sparse_backward(Q, K, V, DO, LSE, DELTA, DQ, GK, GV, IDX, MASK, scale, scale_log2, n_q, n_k, topk, heads_kv,
                     group, causal_offset, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh,
                     sib, sih, sim, smb, smh, smm, smn, sdb, sdh, sdm, D, DV, CAUSAL: tl.constexpr,
                     HAS_MASK: tl.constexpr, DEDUP: tl.constexpr, PADDING_MASKED: tl.constexpr,
                     PAST_END_MASKED: tl.constexpr, ATOMIC: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BLOCK_H: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    row, head_block, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row64 = row.to(tl.int64)
    b, kv_head = (bh // heads_kv).to(tl.int64), bh % heads_kv
    in_group = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = in_group < group
    heads = kv_head * group + in_group
    h64 = heads.to(tl.int64)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    d_ok, dv_ok = head_ok[:, None] & (dims[None, :] < D), head_ok[:, None] & (dims_v[None, :] < DV)
    q = tl.load(Q + b * sqb + h64[:, None] * sqh + row64 * sqm + dims[None, :], mask=d_ok, other=0.0)
    do = tl.load(DO + b * sob + h64[:, None] * soh + row64 * som + dims_v[None, :], mask=dv_ok, other=0.0)
    lse = tl.load(LSE + b * slb + h64 * slh + row64, mask=head_ok, other=0.0)
    delta = tl.load(DELTA + b * slb + h64 * slh + row64, mask=head_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # a row with no key: P = 0 by `visible`
    idx_row = IDX + b * sib + kv_head * sih + row64 * sim
    k_base = K + b * skb + kv_head.to(tl.int64) * skh
    v_base = V + b * svb + kv_head.to(tl.int64) * svh
    dk_base = GK + (b * heads_kv + kv_head) * n_k * D  # the fp32 buffers are contiguous (B, Hkv, Nk, D or Dv)
    dv_base = GV + (b * heads_kv + kv_head) * n_k * DV
    mask_row = MASK + b * smb + row64 * smm
    dq = tl.zeros([BLOCK_H, BD], dtype=tl.float32)
    for start in range(0, topk, BLOCK_N):
        key, shown = listed_keys(idx_row, start, topk, n_k, row, causal_offset, CAUSAL, DEDUP, PADDING_MASKED,
                                 PAST_END_MASKED, BLOCK_N)
        visible = visible_keys(shown, head_ok, heads, key, mask_row, smh, smn, HAS_MASK)
        read = tl.max(visible.to(tl.int32), axis=0) > 0
        k = tl.load(k_base + key[:, None] * skn + dims[None, :], mask=read[:, None] & (dims[None, :] < D), other=0.0)
        v = tl.load(v_base + key[:, None] * svn + dims_v[None, :], mask=read[:, None] & (dims_v[None, :] < DV),
                    other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)
        dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")  # dS stays fp32
        add_rows(dv_base, key, dims_v, DV, read, tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do), ATOMIC)
        add_rows(dk_base, key, dims, D, read, tl.dot(tl.trans(ds), q.to(tl.float32), input_precision="ieee") * scale,
                  ATOMIC)
    tl.store(DQ + b * sdb + h64[:, None] * sdh + row64 * sdm + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=d_ok)


def gradient_buffers(a: CheckedCall, out, do):
    """(delta, dq, dk, dv) of a backward over chosen keys: D_i = dO_i . O_i from the rounded O (fp32, laid out as
    lse), dq in q's dtype, and the fp32 buffers of dK and dV, zero and contiguous (B, Hkv, Nk, D or Dv), that the
    kernel adds into."""
    s, q = a.shapes, a.q
    delta = (do.float() * out.float()).sum(-1).contiguous()
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(s.batch, s.heads_kv, s.n_k, s.head_dim, dtype=torch.float32, device=q.device)
    dv = torch.zeros(s.batch, s.heads_kv, s.n_k, s.head_dim_v, dtype=torch.float32, device=q.device)
    return delta, dq, dk, dv


def sparse_backward(a: SparseArgs, out, lse, do, mutant: str | None = None):
    """(dq, dk, dv) in q's dtype for the forward's ``out`` and ``lse`` and the upstream gradient ``do``."""
    q = a.q
    delta, dq, dk, dv = gradient_buffers(a, out, do)
    _sparse_backward[a.grid](q, a.k, a.v, do, lse, delta, dq, dk, dv, a.indices, a.mask, a.scale,
                             a.scale / math.log(2), *a.runtime, q.stride(0), q.stride(1), q.stride(2),
                             *a.k.stride()[:3], *a.v.stride()[:3], *do.stride()[:3], *lse.stride()[:2],
                             *a.index_strides, *a.mask_strides, *dq.stride()[:3], **a.sizes, **a.flags,
                             **switches(mutant),
                             ATOMIC=mutant != "dk_written_not_added")
    return dq, dk.to(q.dtype), dv.to(q.dtype)
