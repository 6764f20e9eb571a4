"""Flash-attention forward in Triton: online softmax over key tiles, fp32 accumulators, P rounded to the
input dtype before P @ V, the natural-log lse returned beside the output.

On a CUDA GPU the kernel is compiled; on the CPU it runs under the Triton interpreter, which must be chosen
(TRITON_INTERPRET=1) before triton is imported: `pytest --flashcheck-device cpu` sets it.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import flashcheck

BLOCK_M = 32
BLOCK_N = 32


@triton.jit
def _attention_fwd(Q, K, V, Out, Lse,
                   sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod, slb, slh, slm,
                   n_heads, n_q, n_k, causal_offset, qk_scale,
                   IS_CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // n_heads).to(tl.int64)
    h = (pid_bh % n_heads).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < n_q

    q = tl.load(Q + b * sqb + h * sqh + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=row_ok[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)

    hi = n_k
    if IS_CAUSAL:  # key tiles past the last visible key of this query tile are skipped
        last_row = tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_q) - 1
        hi = tl.minimum(n_k, tl.maximum(last_row + causal_offset + 1, 0))
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < n_k
        k = tl.load(K + b * skb + h * skh + cols[None, :] * skn + offs_d[:, None] * skd, mask=col_ok[None, :], other=0.0)
        s = tl.dot(q, k) * qk_scale  # base-2 logits
        visible = row_ok[:, None] & col_ok[None, :]
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet stays at 0
        alpha = tl.math.exp2(m_i - m_sub)
        p = tl.math.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + offs_d[None, :] * svd, mask=col_ok[:, None], other=0.0)
        acc = tl.dot(p.to(V.dtype.element_ty), v, acc * alpha[:, None])
        m_i = m_new

    l_safe = tl.where(l_i == 0.0, 1.0, l_i)  # a row with no visible key: out = 0, lse = -inf
    out = acc / l_safe[:, None]
    tl.store(Out + b * sob + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod, out.to(Out.dtype.element_ty),
             mask=row_ok[:, None])
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(Lse + b * slb + h * slh + offs_m * slm, lse, mask=row_ok)


@flashcheck.kernel(dtypes=("fp16", "bf16", "fp32"), causal=("none", "bottom_right"), attn_mask=False, gqa=False,
                   head_dims=(16, 32, 64, 128), fully_masked_rows="zero", precision="flash")
def attention(q, k, v, *, scale, causal="none", attn_mask=None):
    """softmax(scale * q @ k^T) @ v for q (B, H, Nq, D), k and v (B, H, Nk, D); returns (out, lse).

    ``causal="bottom_right"``: query i sees keys j <= i + Nk - Nq (rows with none give 0).
    """
    if attn_mask is not None:
        raise flashcheck.Unsupported("tinyflash takes no attn_mask")
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, BLOCK_M), B * H)
    _attention_fwd[grid](q, k, v, out, lse, *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(),
                         H, n_q, n_k, n_k - n_q if causal == "bottom_right" else 0, scale / math.log(2.0),
                         IS_CAUSAL=causal != "none", BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, HEAD_DIM=d)
    return out, lse
