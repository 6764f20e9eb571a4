"""``flashcheck:triton-fp8``: a Triton flash-attention kernel on fp8 inputs with FA3's descales.

One program per (query tile, batch entry * query head). The fp8 tiles go to ``tl.dot`` as they are (fp32
accumulation: on the H200 the fp8 tensor cores); the scores are scaled by ``scale * q_descale * k_descale``
in the base-2 domain, the online softmax runs in fp32, P is rounded to the inputs' fp8 format for the second
fp8 ``tl.dot``, and the output, divided by the row sum and multiplied by ``v_descale``, is stored in bf16.
Causal masks align top-left or bottom-right. Its planted bug (:mod:`flashcheck.kernels.planted`) is a switch of
the kernel, ``IGNORE_KD``.
"""

from __future__ import annotations

import math

import torch

from ...contract.formats import FORMATS, FP8_DTYPES, FP8_OUTPUT
from ...contract.spec import Kernel, KernelSpec
from .online import q_tile_and_bases, BLOCK_M, BLOCK_N, LN2, finish, online_step, pow2, start_state
from .runtime import import_triton

__all__ = ["NAME", "make_fp8_triton_kernel"]

NAME = "flashcheck:triton-fp8"
_CAUSAL = {"none": 0, "top_left": 1, "bottom_right": 2}

triton, tl = import_triton()


@triton.jit
def _fp8_forward(Q, K, V, O, LSE, QD, KD, VD, scale_log2, n_q, n_k, heads_q, sqb, sqh, sqm, sqd, skb, skh, skm, skd,
                 svb, svh, svm, svd, sob, soh, som, sod, GROUP, D, DV,
                 CAUSAL: tl.constexpr, IGNORE_KD: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q, rows, k_base, v_base, offset, bh, kv = q_tile_and_bases(Q, K, V, heads_q, GROUP, n_q, n_k, sqb, sqh, sqm, sqd,
                                                               skb, skh, svb, svh, D, CAUSAL, BD, BLOCK_M)
    descale = tl.load(QD + kv)  # kv: the flattened (batch entry, K/V head) of the descales
    if not IGNORE_KD:
        descale = descale * tl.load(KD + kv)
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    m_i, l_i, acc = start_state(BLOCK_M, BDV)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        kt = tl.load(k_base + cols[None, :] * skm + dims[:, None] * skd,
                     mask=(cols[None, :] < n_k) & (dims[:, None] < D), other=0.0)
        v = tl.load(v_base + cols[:, None] * svm + dims_v[None, :] * svd,
                    mask=(cols[:, None] < n_k) & (dims_v[None, :] < DV), other=0.0)
        visible = (cols[None, :] < n_k) & (rows[:, None] < n_q)
        if CAUSAL != 0:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
            # P is 0 on a hidden key, and 0 * NaN is NaN: no row of this tile reads a key none of them sees.
            v = tl.where((tl.sum(visible.to(tl.int32), 0) > 0)[:, None], v, tl.zeros_like(v))
        m_i, l_i, acc = online_step(q, kt, v, visible, m_i, l_i, acc, scale_log2 * descale)
    out, lse2 = finish(m_i, l_i, acc)
    out = out * tl.load(VD + kv)
    tl.store(O + (bh // heads_q) * sob + (bh % heads_q) * soh + rows[:, None] * som + dims_v[None, :] * sod, out.to(O.dtype.element_ty),
             mask=(rows[:, None] < n_q) & (dims_v[None, :] < DV))
    tl.store(LSE + bh * n_q + rows, lse2 * LN2, mask=rows < n_q)


def _forward(q, k, v, *, scale, causal, q_descale, k_descale, v_descale, mutant):
    B, Hq, Nq, D = q.shape
    Nk, Dv = k.shape[2], v.shape[3]
    out = torch.empty(B, Hq, Nq, Dv, dtype=FORMATS[FP8_OUTPUT].dtype, device=q.device)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    descales = [d.to(torch.float32).contiguous() for d in (q_descale, k_descale, v_descale)]
    grid = (triton.cdiv(Nq, BLOCK_M), B * Hq)
    _fp8_forward[grid](q, k, v, out, lse, *descales, scale * math.log2(math.e), Nq, Nk, Hq,
                       *q.stride(), *k.stride(), *v.stride(), *out.stride(), Hq // k.shape[1], D, Dv,
                       # the head dims are runtime values: one compilation serves every D below a power of two
                       CAUSAL=_CAUSAL[causal], IGNORE_KD=mutant == "ignores_k_descale",
                       # fp8 tensor-core dots take K dimensions of at least 32
                       BD=max(32, pow2(D)), BDV=max(32, pow2(Dv)), BLOCK_M=BLOCK_M, BLOCK_N=max(32, BLOCK_N))
    return out, lse


def make_fp8_triton_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, q_descale, k_descale, v_descale):
        return _forward(q, k, v, scale=scale, causal=causal, q_descale=q_descale, k_descale=k_descale,
                        v_descale=v_descale, mutant=mutant)

    spec = KernelSpec(dtypes=FP8_DTYPES, causal=tuple(_CAUSAL), gqa=True, dv_equals_d=False, max_head_dim=256,
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=True,
                      nan_safe_masking=True)
    attention.__name__ = attention.__qualname__ = "triton_fp8"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
