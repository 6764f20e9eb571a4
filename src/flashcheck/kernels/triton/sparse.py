"""``flashcheck:triton-sparse``: a Triton top-k gather attention over sparse index sets, forward and backward.

``kernel(q, k, v, *, scale, causal, attn_mask=None, indices)``, the convention of
:mod:`flashcheck.contract.key_sets` (``torch:sparse``'s): q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D or Dv), GQA,
causal none, top_left or bottom_right, ``indices`` int32 (B, Hkv or 1, Nq, topk); returns ``(out, lse)``, lse
in natural log and fp32.

One program per (query row, block of the query heads of one K/V head, batch entry and K/V head) walks the row's
list tile by tile (:mod:`.sparse_keys` reads it: -1 and indices past the keys never loaded, a repeated key
attended once, causal applied to the key named), gathers the listed K and V rows with masked loads, and runs the
online softmax of the dense form (scores in fp32 and base 2, P rounded to the inputs' dtype before P @ V). A key no
row of the tile shows is never read, so NaN in it cannot reach the output. Rows with no visible key give out 0 and
lse -inf.

The backward (:mod:`.sparse_backward`) recomputes P from the saved lse and adds each gathered key's dK and dV with
atomic adds: two calls may sum in other orders, so ``deterministic_backward`` is False. Its planted bugs
(:data:`flashcheck.kernels.planted.TRITON_SPARSE`) are switches of the kernels.
"""

from __future__ import annotations

import math

import torch

from ...contract.key_sets import KeySets
from ...contract.spec import Kernel, KernelSpec
from .online import LN2, finish, online_step, start_state
from .runtime import import_triton, triton_dtypes
from .sparse_backward import sparse_backward
from .sparse_keys import SparseArgs, attend, listed_keys, switches, visible_keys

__all__ = ["NAME", "make_sparse_kernel", "sparse_forward"]

NAME = "flashcheck:triton-sparse"
FORWARD_BUGS = ("padding_reads_key0", "counts_duplicates", "past_end_clamped")

triton, tl = import_triton()
# Sizes and strides stay runtime values: one compiled kernel per dtype, tile and constexpr serves every shape.
RUNTIME_SIZES = ("scale_log2", "n_q", "n_k", "topk", "heads_kv", "group", "causal_offset", "D", "DV", "sqb", "sqh",
                 "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som", "slb", "slh", "sib", "sih",
                 "sim", "smb", "smh", "smm", "smn")


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _sparse_forward(Q, K, V, O, LSE, IDX, MASK, scale_log2, n_q, n_k, topk, heads_kv, group, causal_offset,
                    sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh, sib, sih, sim,
                    smb, smh, smm, smn, D, DV, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, DEDUP: tl.constexpr,
                    PADDING_MASKED: tl.constexpr, PAST_END_MASKED: tl.constexpr, BD: tl.constexpr,
                    BDV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    row, head_block, bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    row64 = row.to(tl.int64)
    b, kv_head = (bh // heads_kv).to(tl.int64), bh % heads_kv
    in_group = head_block * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = in_group < group
    heads = kv_head * group + in_group  # the query heads of this block
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    q = tl.load(Q + b * sqb + heads.to(tl.int64)[:, None] * sqh + row64 * sqm + dims[None, :],
                mask=head_ok[:, None] & (dims[None, :] < D), other=0.0)
    idx_row = IDX + b * sib + kv_head * sih + row64 * sim
    k_base = K + b * skb + kv_head.to(tl.int64) * skh
    v_base = V + b * svb + kv_head.to(tl.int64) * svh
    mask_row = MASK + b * smb + row64 * smm
    m_i, l_i, acc = start_state(BLOCK_H, BDV)
    for start in range(0, topk, BLOCK_N):
        key, shown = listed_keys(idx_row, start, topk, n_k, row, causal_offset, CAUSAL, DEDUP, PADDING_MASKED,
                                 PAST_END_MASKED, BLOCK_N)
        visible = visible_keys(shown, head_ok, heads, key, mask_row, smh, smn, HAS_MASK)
        read = tl.max(visible.to(tl.int32), axis=0) > 0  # keys some head of the block sees: the only ones loaded
        k = tl.load(k_base + key[:, None] * skn + dims[None, :], mask=read[:, None] & (dims[None, :] < D), other=0.0)
        v = tl.load(v_base + key[:, None] * svn + dims_v[None, :], mask=read[:, None] & (dims_v[None, :] < DV),
                    other=0.0)
        m_i, l_i, acc = online_step(q, tl.trans(k), v, visible, m_i, l_i, acc, scale_log2)
    out, lse2 = finish(m_i, l_i, acc)
    tl.store(O + b * sob + heads.to(tl.int64)[:, None] * soh + row64 * som + dims_v[None, :],
             out.to(O.dtype.element_ty), mask=head_ok[:, None] & (dims_v[None, :] < DV))
    tl.store(LSE + b * slb + heads.to(tl.int64) * slh + row64, lse2 * LN2, mask=head_ok)


def sparse_forward(a: SparseArgs, mutant: str | None = None):
    """(out (B, Hq, Nq, Dv) in q's dtype, lse (B, Hq, Nq) fp32 natural log) of a checked call."""
    s, q = a.shapes, a.q
    out = torch.empty(s.batch, s.heads_q, s.n_q, s.head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(s.batch, s.heads_q, s.n_q, dtype=torch.float32, device=q.device)
    _sparse_forward[a.grid](q, a.k, a.v, out, lse, a.indices, a.mask, a.scale / math.log(2), *a.runtime,
                            q.stride(0), q.stride(1), q.stride(2), *a.k.stride()[:3], *a.v.stride()[:3],
                            *out.stride()[:3], *lse.stride()[:2], *a.index_strides, *a.mask_strides,
                            **a.sizes, **a.flags, **switches(mutant))
    return out, lse


def make_sparse_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, indices):
        def args(q, k, v):
            return SparseArgs(q, k, v, indices, scale=scale, causal=causal, attn_mask=attn_mask)
        return attend(q, k, v, args, sparse_forward, sparse_backward, mutant)

    spec = KernelSpec(key_sets=KeySets(duplicates="once", past_end="masked", padding="anywhere"),
                      dtypes=triton_dtypes(device), causal=("none", "top_left", "bottom_right"), attn_mask=True,
                      gqa=True, max_head_dim=256, dv_equals_d=False, fully_masked_rows="zero", precision="flash",
                      devices=(device,), nan_safe_masking=True, backward=True,
                      deterministic_backward=False)  # dK and dV of a key: atomic adds from every row that lists it
    attention.__name__ = attention.__qualname__ = "triton_sparse"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
