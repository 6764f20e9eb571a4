"""The backward pass of ``flashcheck:triton-block-sparse``: one Triton kernel, the forward's layout (one program
per query block of one query head), its lists read by the very same code (:func:`.block_tiles.key_block`).

With the forward's lse (natural log), its rounded output O and D_i = dO_i . O_i (fp32, on the host), each key
block of the program's list rows:

    P  = exp2(S * log2(e) - lse * log2(e))      recomputed in fp32, 0 where a key is hidden
    dP = dO V^T,  dS = P (dP - D)               fp32; dS is kept in fp32, as flashcheck:triton's backward keeps it
    dQ += dS K                                  fp32, stored once per program (times the scale)
    dV[block] += P^T dO,  dK[block] += scale dS^T Q   added into the block's key rows of fp32 buffers with atomic
                                                      adds

A key block is visited by many query blocks and by every query head of its K/V head, so its dK and dV are sums
over programs: atomic adds, in whatever order the programs run, hence ``deterministic_backward=False``. Only the
keys some query of the program sees are added to. The buffers are rounded to the inputs' dtype at the end. The
planted bug ``dk_written_not_added`` stores instead of adding: the last program to write a block wins.
"""

from __future__ import annotations

import math

from .block_tiles import BlockArgs, key_block, list_count, program_block, switches
from .runtime import import_triton
from .sparse_backward import add_rows, gradient_buffers

__all__ = ["block_sparse_backward"]

triton, tl = import_triton()
RUNTIME_SIZES = ("scale", "scale_log2", "n_q", "n_k", "heads_q", "group", "causal_offset", "width", "D", "DV",
                 "sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som", "slb", "slh",
                 "smb", "smh", "smm", "smn", "sdb", "sdh", "sdm")


@triton.jit
def _grad_list(dq, q, do, lse2, delta, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset, mask_rows, smn,
               k_base, v_base, dk_base, dv_base, skn, svn, dims, dims_v, D, DV, scale, scale_log2,
               RULES: tl.constexpr, OFF_BY_ONE: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
               IN_BOUNDS: tl.constexpr, ATOMIC: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of the key blocks of one list row, their dK and dV added into the buffers."""
    for entry in range(0, list_count(NUM, row, width, OFF_BY_ONE)):
        keys, visible, read, k, v = key_block(IDX, row, entry, width, rows, row_ok, n_k, causal_offset, mask_rows,
                                              smn, k_base, v_base, skn, svn, dims, dims_v, D, DV, RULES, CAUSAL,
                                              HAS_MASK, IN_BOUNDS, BLOCK_N)
        s = tl.dot(q, tl.trans(k)) * scale_log2
        p = tl.math.exp2(tl.where(visible, s - lse2[:, None], float("-inf")))  # hidden: 0, never an overflow
        dp = tl.dot(do, tl.trans(v))
        ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)
        dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")  # dS stays fp32
        add_rows(dv_base, keys, dims_v, DV, read, tl.dot(tl.trans(p.to(do.dtype)), do), ATOMIC)
        add_rows(dk_base, keys, dims, D, read, tl.dot(tl.trans(ds), q.to(tl.float32), input_precision="ieee") * scale,
                 ATOMIC)
    return dq


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _block_sparse_backward(Q, K, V, DO, LSE, DELTA, DQ, GK, GV, NUM, IDX, MASK, scale, scale_log2, n_q, n_k,
                           heads_q, group, causal_offset, width, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob,
                           soh, som, slb, slh, smb, smh, smm, smn, sdb, sdh, sdm, D, DV, CAUSAL: tl.constexpr,
                           HAS_MASK: tl.constexpr, LISTS: tl.constexpr, FULL_RULES: tl.constexpr,
                           OFF_BY_ONE: tl.constexpr, IN_BOUNDS: tl.constexpr, ATOMIC: tl.constexpr, BD: tl.constexpr,
                           BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b, h, kv_head, rows, row_ok, row = program_block(heads_q, group, n_q, BLOCK_M)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    d_ok, dv_ok = row_ok[:, None] & (dims[None, :] < D), row_ok[:, None] & (dims_v[None, :] < DV)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :], mask=d_ok, other=0.0)
    do = tl.load(DO + b * sob + h * soh + rows[:, None] * som + dims_v[None, :], mask=dv_ok, other=0.0)
    lse = tl.load(LSE + b * slb + h * slh + rows, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + b * slb + h * slh + rows, mask=row_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)  # a row with no key: P = 0 by `visible`
    k_base = K + b * skb + kv_head * skh
    v_base = V + b * svb + kv_head * svh
    kv = b * (heads_q // group) + kv_head  # the fp32 buffers are contiguous (B, Hkv, Nk, D or Dv)
    dk_base = GK + kv * n_k * D
    dv_base = GV + kv * n_k * DV
    mask_rows = MASK + b * smb + h * smh + rows[:, None] * smm
    dq = tl.zeros([BLOCK_M, BD], dtype=tl.float32)
    dq = _grad_list(dq, q, do, lse2, delta, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset, mask_rows, smn,
                    k_base, v_base, dk_base, dv_base, skn, svn, dims, dims_v, D, DV, scale, scale_log2, True,
                    OFF_BY_ONE, CAUSAL, HAS_MASK, IN_BOUNDS, ATOMIC, BLOCK_N)
    if LISTS == 2:
        row = row + tl.num_programs(0) * tl.num_programs(1)
        dq = _grad_list(dq, q, do, lse2, delta, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset, mask_rows,
                        smn, k_base, v_base, dk_base, dv_base, skn, svn, dims, dims_v, D, DV, scale, scale_log2,
                        FULL_RULES, False, CAUSAL, HAS_MASK, IN_BOUNDS, ATOMIC, BLOCK_N)
    tl.store(DQ + b * sdb + h * sdh + rows[:, None] * sdm + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=d_ok)


def block_sparse_backward(a: BlockArgs, out, lse, do, mutant: str | None = None):
    """(dq, dk, dv) in q's dtype for the forward's ``out`` and ``lse`` and the upstream gradient ``do``."""
    q = a.q
    delta, dq, dk, dv = gradient_buffers(a, out, do)
    _block_sparse_backward[a.grid](q, a.k, a.v, do, lse, delta, dq, dk, dv, a.num, a.idx, a.mask,
                                   a.scale, a.scale / math.log(2), *a.runtime, *q.stride()[:3], *a.k.stride()[:3],
                                   *a.v.stride()[:3], *do.stride()[:3], *lse.stride()[:2], *a.mask_strides,
                                   *dq.stride()[:3], **a.sizes, **a.flags, **switches(mutant),
                                   ATOMIC=mutant != "dk_written_not_added")
    return dq, dk.to(q.dtype), dv.to(q.dtype)
