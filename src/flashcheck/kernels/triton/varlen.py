"""``flashcheck:triton-varlen``: a Triton flash-attention kernel over packed variable-length batches.

One program per (query tile, head, sequence) reads its sequence's offsets, walks its keys tile by tile with
the online softmax (scores in fp32 and base 2, P rounded to the inputs' dtype before P @ V), and masks the
causal alignment of its own lengths (bottom-right). Loads are masked at the sequence's end, so nothing past
it is read. Its planted bug (:mod:`flashcheck.kernels.planted`) is a switch of the kernel, ``PAST_END``.
"""

from __future__ import annotations

import math

import torch

from ...contract.spec import Kernel, KernelSpec
from .online import BLOCK_M, BLOCK_N, LN2, finish, online_step, pow2, start_state
from .runtime import import_triton, triton_dtypes

__all__ = ["NAME", "make_varlen_kernel"]

NAME = "flashcheck:triton-varlen"

triton, tl = import_triton()


@triton.jit
def _varlen_forward(Q, K, V, O, LSE, cu_q, cu_k, scale_log2, total_q, sqm, sqh, skm, skh, svm, svh, som, soh,
                    GROUP: tl.constexpr, CAUSAL: tl.constexpr, PAST_END: tl.constexpr, D: tl.constexpr,
                    DV: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    tile, head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_start, k_start = tl.load(cu_q + seq), tl.load(cu_k + seq)
    n_q = tl.load(cu_q + seq + 1) - q_start
    n_k = tl.load(cu_k + seq + 1) - k_start + PAST_END
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    if tile * BLOCK_M < n_q:
        dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
        kv_head = head // GROUP
        q = tl.load(Q + (q_start + rows)[:, None] * sqm + head * sqh + dims[None, :],
                    mask=(rows[:, None] < n_q) & (dims[None, :] < D), other=0.0)
        m_i, l_i, acc = start_state(BLOCK_M, BDV)
        for start in range(0, n_k, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            k = tl.load(K + (k_start + cols)[None, :] * skm + kv_head * skh + dims[:, None],
                        mask=(cols[None, :] < n_k) & (dims[:, None] < D), other=0.0)
            v = tl.load(V + (k_start + cols)[:, None] * svm + kv_head * svh + dims_v[None, :],
                        mask=(cols[:, None] < n_k) & (dims_v[None, :] < DV), other=0.0)
            visible = (cols[None, :] < n_k) & (rows[:, None] < n_q)
            if CAUSAL:
                visible = visible & (cols[None, :] <= rows[:, None] + (n_k - n_q))
            m_i, l_i, acc = online_step(q, k, v, visible, m_i, l_i, acc, scale_log2)
        out, lse2 = finish(m_i, l_i, acc)
        tl.store(O + (q_start + rows)[:, None] * som + head * soh + dims_v[None, :], out.to(O.dtype.element_ty),
                 mask=(rows[:, None] < n_q) & (dims_v[None, :] < DV))
        tl.store(LSE + head * total_q + q_start + rows, lse2 * LN2, mask=rows < n_q)


def make_varlen_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
        total_q, heads, d = q.shape
        dv = v.shape[2]
        out = torch.empty(total_q, heads, dv, dtype=q.dtype, device=q.device)
        lse = torch.empty(heads, total_q, dtype=torch.float32, device=q.device)
        batch = cu_seqlens_q.numel() - 1
        grid = (max(1, triton.cdiv(max_seqlen_q, BLOCK_M)), heads, batch)
        if batch and total_q:
            _varlen_forward[grid](q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale / math.log(2), total_q,
                                  q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                                  out.stride(0), out.stride(1), GROUP=heads // k.shape[1],
                                  CAUSAL=causal == "bottom_right", PAST_END=int(mutant == "reads_past_end"), D=d,
                                  DV=dv, BD=pow2(d), BDV=pow2(dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
        return out, lse

    spec = KernelSpec(form="varlen", dtypes=triton_dtypes(device), causal=("none", "bottom_right"), gqa=True,
                      max_head_dim=256, dv_equals_d=False, fully_masked_rows="zero", precision="flash",
                      devices=(device,), batch_invariant=True, nan_safe_masking=True)
    attention.__name__ = attention.__qualname__ = "triton_varlen"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
