"""``flashcheck:triton-block-sparse``: a Triton block-sparse prefill attention over key-block lists, forward and
backward.

``kernel(q, k, v, *, scale, causal, attn_mask=None, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
full_kv_indices=None)``, the convention of :mod:`flashcheck.contract.block_sparse` with blocks of 16 x 16 and full
blocks masked (``torch:block-sparse``'s, FlexAttention's lists): q (B, Hq, Nq, D), k and v (B, Hkv, Nk, D or Dv),
GQA, causal none, top_left or bottom_right, a boolean mask; returns ``(out, lse)``, lse in natural log and fp32.

One program per (query block, batch entry and query head) walks the first ``kv_num_blocks`` entries of its row,
then its row of the full list (:mod:`.block_tiles` reads them: keys past Nk never loaded, the causal alignment and
the mask applied inside every block, full ones too), and runs the online softmax of the dense form over each key
block (scores in fp32 and base 2, P rounded to the inputs' dtype before P @ V). Rows with no visible key give out 0
and lse -inf.

The backward (:mod:`.block_sparse_backward`) recomputes P from the saved lse and adds each key block's dK and dV
with atomic adds (a block is visited by many query blocks and heads): two calls may sum in other orders, so
``deterministic_backward`` is False. Its planted bugs (:data:`flashcheck.kernels.planted.TRITON_BLOCK_SPARSE`) are
switches of the kernels.
"""

from __future__ import annotations

import math

import torch

from ...contract.block_sparse import BlockSparse
from ...contract.spec import Kernel, KernelSpec
from .block_sparse_backward import block_sparse_backward
from .block_tiles import BlockArgs, key_block, list_count, program_block, switches
from .online import LN2, finish, online_step, start_state
from .runtime import import_triton, triton_dtypes
from .sparse_keys import attend

__all__ = ["BLOCKS", "FORWARD_BUGS", "NAME", "block_sparse_forward", "make_block_sparse_kernel"]

NAME = "flashcheck:triton-block-sparse"
FORWARD_BUGS = ("count_off_by_one", "tail_block_as_full", "full_list_trusted")
BLOCKS = BlockSparse(q_block=16, kv_block=16, full_blocks="masked")  # small: a short case spans several blocks

triton, tl = import_triton()
RUNTIME_SIZES = ("scale_log2", "n_q", "n_k", "heads_q", "group", "causal_offset", "width", "D", "DV", "sqb",
                 "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som", "slb", "slh", "smb",
                 "smh", "smm", "smn")


@triton.jit
def _attend_list(q, m_i, l_i, acc, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset, mask_rows, smn,
                 k_base, v_base, skn, svn, dims, dims_v, D, DV, scale_log2, RULES: tl.constexpr,
                 OFF_BY_ONE: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, IN_BOUNDS: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """The online softmax over the key blocks of one list row."""
    for entry in range(0, list_count(NUM, row, width, OFF_BY_ONE)):
        _, visible, _, k, v = key_block(IDX, row, entry, width, rows, row_ok, n_k, causal_offset, mask_rows, smn,
                                        k_base, v_base, skn, svn, dims, dims_v, D, DV, RULES, CAUSAL, HAS_MASK,
                                        IN_BOUNDS, BLOCK_N)
        m_i, l_i, acc = online_step(q, tl.trans(k), v, visible, m_i, l_i, acc, scale_log2)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _block_sparse_forward(Q, K, V, O, LSE, NUM, IDX, MASK, scale_log2, n_q, n_k, heads_q, group, causal_offset,
                          width, sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, sob, soh, som, slb, slh, smb, smh, smm,
                          smn, D, DV, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, LISTS: tl.constexpr,
                          FULL_RULES: tl.constexpr, OFF_BY_ONE: tl.constexpr, IN_BOUNDS: tl.constexpr,
                          BD: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b, h, kv_head, rows, row_ok, row = program_block(heads_q, group, n_q, BLOCK_M)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :],
                mask=row_ok[:, None] & (dims[None, :] < D), other=0.0)
    k_base = K + b * skb + kv_head * skh
    v_base = V + b * svb + kv_head * svh
    mask_rows = MASK + b * smb + h * smh + rows[:, None] * smm
    m_i, l_i, acc = start_state(BLOCK_M, BDV)
    m_i, l_i, acc = _attend_list(q, m_i, l_i, acc, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset, mask_rows,
                                 smn, k_base, v_base, skn, svn, dims, dims_v, D, DV, scale_log2, True, OFF_BY_ONE,
                                 CAUSAL, HAS_MASK, IN_BOUNDS, BLOCK_N)
    if LISTS == 2:
        row = row + tl.num_programs(0) * tl.num_programs(1)
        m_i, l_i, acc = _attend_list(q, m_i, l_i, acc, NUM, IDX, row, width, rows, row_ok, n_k, causal_offset,
                                     mask_rows, smn, k_base, v_base, skn, svn, dims, dims_v, D, DV, scale_log2,
                                     FULL_RULES, False, CAUSAL, HAS_MASK, IN_BOUNDS, BLOCK_N)
    out, lse2 = finish(m_i, l_i, acc)
    tl.store(O + b * sob + h * soh + rows[:, None] * som + dims_v[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & (dims_v[None, :] < DV))
    tl.store(LSE + b * slb + h * slh + rows, lse2 * LN2, mask=row_ok)


def block_sparse_forward(a: BlockArgs, mutant: str | None = None):
    """(out (B, Hq, Nq, Dv) in q's dtype, lse (B, Hq, Nq) fp32 natural log) of a checked call."""
    s, q = a.shapes, a.q
    out = torch.empty(s.batch, s.heads_q, s.n_q, s.head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(s.batch, s.heads_q, s.n_q, dtype=torch.float32, device=q.device)
    _block_sparse_forward[a.grid](q, a.k, a.v, out, lse, a.num, a.idx, a.mask, a.scale / math.log(2), *a.runtime,
                                  *q.stride()[:3], *a.k.stride()[:3], *a.v.stride()[:3], *out.stride()[:3],
                                  *lse.stride()[:2], *a.mask_strides, **a.sizes, **a.flags, **switches(mutant))
    return out, lse


def make_block_sparse_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""
    blocks = dict(q_block=BLOCKS.q_block, kv_block=BLOCKS.kv_block)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, kv_num_blocks, kv_indices,
                  full_kv_num_blocks=None, full_kv_indices=None):
        lists = dict(kv_num_blocks=kv_num_blocks, kv_indices=kv_indices, full_kv_num_blocks=full_kv_num_blocks,
                     full_kv_indices=full_kv_indices)

        def args(q, k, v):
            return BlockArgs(q, k, v, lists, scale=scale, causal=causal, attn_mask=attn_mask, **blocks)
        return attend(q, k, v, args, block_sparse_forward, block_sparse_backward, mutant)

    spec = KernelSpec(block_sparse=BLOCKS, dtypes=triton_dtypes(device), causal=("none", "top_left", "bottom_right"),
                      attn_mask=True, gqa=True, max_head_dim=256, dv_equals_d=False, fully_masked_rows="zero",
                      precision="flash", devices=(device,), nan_safe_masking=True, backward=True,
                      deterministic_backward=False)  # dK and dV of a block: atomic adds from every query block
    attention.__name__ = attention.__qualname__ = "triton_block_sparse"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
