"""``flashcheck:triton-fp8-kv-blocks``: a Triton flash-attention kernel on fp8 inputs whose K and V come with
block scales (the ``per_block_kv`` scheme, :mod:`flashcheck.contract.quantization`): one fp32 scale per block of
16 keys and K/V head, besides FA3's per-head descales. Key j's value is ``k8[j] * k_block_scales[j // 16] *
k_descale``, and V's alike.

One program per (query tile, batch entry * query head) walks the keys in tiles of 16, one block scale per
tile. The scores are ``tl.dot(q8, k8^T)`` with fp32 accumulation, times ``scale * q_descale * k_descale`` and
each key's block scale in the base-2 domain; the online softmax runs in fp32; P is rounded to bf16 and V's codes
converted to bf16 (exact) for the second dot, whose fp32 product is multiplied by the tile's V block scale before
it is added to the accumulator. The output, divided by the row sum and multiplied by ``v_descale``, is stored in
bf16; the lse is in natural log. Causal masks align top-left or bottom-right; GQA; Dv may differ from D.

Under the Triton interpreter (the CPU) two of its bf16 operations are wrong: its fp32 -> bf16 cast truncates
instead of rounding to nearest, and its bf16 ``tl.dot`` multiplies raw bit patterns
(:data:`~.runtime.INTERPRETER_WRONG_DTYPES`). There the kernel rounds to bf16 on the bits (to nearest even) and
keeps the rounded values in fp32 for an IEEE fp32 dot: the products of two bf16 values are exact in fp32, so the
dot computes what the bf16 dot with fp32 accumulation does. The fp8 codes' conversions and the fp8 dot are exact
there.

Its planted bugs (:data:`flashcheck.kernels.planted.FP8_KV_BLOCKS`) are switches of the kernel:
``NEXT_AT_EDGE``, ``ZERO_DIVIDES`` and ``TAIL_UNSCALED``.
"""

from __future__ import annotations

import math

import torch

from ...contract.formats import FORMATS, FP8_DTYPES, FP8_OUTPUT
from ...contract.quantization import SCHEMES
from ...contract.spec import Kernel, KernelSpec
from ...errors import InvalidArgument
from .online import q_tile_and_bases, BLOCK_M, LN2, finish, pow2, start_state
from .runtime import import_triton

__all__ = ["NAME", "SCHEME", "make_fp8_kv_blocks_kernel", "to_bf16"]

NAME = "flashcheck:triton-fp8-kv-blocks"
SCHEME = "per_block_kv"
# One key tile per block of keys: its V block scale multiplies the tile's P @ V as one number.
BLOCK_N = SCHEMES[SCHEME].k.size
MAX_HEAD_DIM = 256
_CAUSAL = {"none": 0, "top_left": 1, "bottom_right": 2}

triton, tl = import_triton()


@triton.jit
def to_bf16(x, BY_BITS: tl.constexpr):
    """``x`` (fp32) rounded to bf16, to nearest even; ``BY_BITS`` (the interpreter): on the bits, the rounded
    value kept in fp32 (finite values; a NaN stays NaN)."""
    if BY_BITS:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _fp8_kv_blocks_forward(Q, K, V, O, LSE, QD, KD, VD, KS, VS, scale_log2, n_q, n_k, n_blocks, heads_q,
                           sqb, sqh, sqm, sqd, skb, skh, skm, skd, svb, svh, svm, svd, sob, soh, som, sod, GROUP, D,
                           DV, CAUSAL: tl.constexpr, NEXT_AT_EDGE: tl.constexpr, ZERO_DIVIDES: tl.constexpr,
                           TAIL_UNSCALED: tl.constexpr, BY_BITS: tl.constexpr, BD: tl.constexpr, BDV: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    q, rows, k_base, v_base, offset, bh, kv = q_tile_and_bases(Q, K, V, heads_q, GROUP, n_q, n_k, sqb, sqh, sqm, sqd,
                                                               skb, skh, svb, svh, D, CAUSAL, BD, BLOCK_M)
    logit_scale = scale_log2 * (tl.load(QD + kv) * tl.load(KD + kv))  # kv: every scale's (batch entry, K/V head)
    k_scales, v_scales = KS + kv * n_blocks, VS + kv * n_blocks
    dims, dims_v = tl.arange(0, BD), tl.arange(0, BDV)
    m_i, l_i, acc = start_state(BLOCK_M, BDV)
    for start in range(0, n_k, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        keys = cols < n_k
        kt = tl.load(k_base + cols[None, :] * skm + dims[:, None] * skd,
                     mask=keys[None, :] & (dims[:, None] < D), other=0.0)
        v = tl.load(v_base + cols[:, None] * svm + dims_v[None, :] * svd,
                    mask=keys[:, None] & (dims_v[None, :] < DV), other=0.0).to(tl.float32)
        # Each key's block scale (BLOCK_N is the block: one scale per tile).
        block = cols // BLOCK_N
        if NEXT_AT_EDGE:
            block = tl.minimum((cols + 1) // BLOCK_N, n_blocks - 1)
        k_scale = tl.load(k_scales + block, mask=keys, other=0.0)
        if TAIL_UNSCALED:
            k_scale = tl.where((n_k % BLOCK_N != 0) & (block == n_blocks - 1), 1.0, k_scale)
        visible = keys[None, :] & (rows[:, None] < n_q)
        if CAUSAL != 0:
            visible = visible & (cols[None, :] <= rows[:, None] + offset)
            # P is 0 on a hidden key, and 0 * NaN is NaN: no row of this tile reads a key none of them sees.
            v = tl.where((tl.sum(visible.to(tl.int32), 0) > 0)[:, None], v, tl.zeros_like(v))
        v_scale = tl.load(v_scales + start // BLOCK_N)
        if ZERO_DIVIDES:
            # V brought to the largest scale of its block and multiplied back after the dot.
            token_scale = tl.load(v_scales + cols // BLOCK_N, mask=keys, other=0.0)
            v_scale = tl.max(token_scale, 0)
            v = v * (token_scale / v_scale)[:, None]
        # The online softmax in fp32 and base 2, over the keys' scores scaled by their block scales; the fp8 dot
        # accumulates in fp32 on Hopper too (max_num_imprecise_acc=0: Triton's default there accumulates in fewer bits).
        s = tl.where(visible, tl.dot(q, kt, max_num_imprecise_acc=0) * (logit_scale * k_scale)[None, :],
                     float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp2(s - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if BY_BITS:
            pv = tl.dot(to_bf16(p, BY_BITS), to_bf16(v, BY_BITS), input_precision="ieee")
        else:
            pv = tl.dot(to_bf16(p, BY_BITS), to_bf16(v, BY_BITS))
        acc = acc * alpha[:, None] + pv * v_scale
        m_i = m_new
    out, lse2 = finish(m_i, l_i, acc)
    out = to_bf16(out * tl.load(VD + kv), BY_BITS)
    tl.store(O + (bh // heads_q) * sob + (bh % heads_q) * soh + rows[:, None] * som + dims_v[None, :] * sod, out.to(O.dtype.element_ty),
             mask=(rows[:, None] < n_q) & (dims_v[None, :] < DV))
    tl.store(LSE + bh * n_q + rows, lse2 * LN2, mask=rows < n_q)


def _scales(name: str, value, shape: tuple) -> torch.Tensor:
    """``value`` as a contiguous fp32 tensor of ``shape``, or the refusal that names it."""
    if not isinstance(value, torch.Tensor) or tuple(value.shape) != shape:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else value
        raise InvalidArgument(name, got, f"expected fp32 scales of shape {shape}",
                              f"Pass {name} as the {SCHEME} scheme gives them: {SCHEMES[SCHEME].k.text()}.")
    return value.to(torch.float32).contiguous()


def _forward(q, k, v, *, scale, causal, descales, block_scales, mutant):
    B, Hq, Nq, D = q.shape
    Hkv, Nk, Dv = k.shape[1], k.shape[2], v.shape[3]
    n_blocks = triton.cdiv(Nk, BLOCK_N)
    d = [_scales(n, t, (B, Hkv)) for n, t in zip(("q_descale", "k_descale", "v_descale"), descales)]
    s = [_scales(n, t, (B, Hkv, n_blocks)) for n, t in zip(("k_block_scales", "v_block_scales"), block_scales)]
    out = torch.empty(B, Hq, Nq, Dv, dtype=FORMATS[FP8_OUTPUT].dtype, device=q.device)
    lse = torch.empty(B, Hq, Nq, dtype=torch.float32, device=q.device)
    if B * Hq * Nq == 0:
        return out, lse
    grid = (triton.cdiv(Nq, BLOCK_M), B * Hq)
    _fp8_kv_blocks_forward[grid](
        q, k, v, out, lse, *d, *s, scale * math.log2(math.e), Nq, Nk, n_blocks, Hq, *q.stride(), *k.stride(),
        *v.stride(), *out.stride(), Hq // Hkv, D, Dv, CAUSAL=_CAUSAL[causal],
        NEXT_AT_EDGE=mutant == "scale_of_next_block_at_edge", ZERO_DIVIDES=mutant == "zero_scale_divides",
        TAIL_UNSCALED=mutant == "k_scale_ignored_in_tail", BY_BITS=q.device.type == "cpu",
        # the head dims are runtime values: one compilation serves every D below a power of two; fp8
        # tensor-core dots take K dimensions of at least 32
        BD=max(32, pow2(D)), BDV=pow2(Dv), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return out, lse


def make_fp8_kv_blocks_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, q_descale, k_descale, v_descale,
                  k_block_scales, v_block_scales):
        return _forward(q, k, v, scale=scale, causal=causal, descales=(q_descale, k_descale, v_descale),
                        block_scales=(k_block_scales, v_block_scales), mutant=mutant)

    spec = KernelSpec(dtypes=FP8_DTYPES, causal=tuple(_CAUSAL), gqa=True, dv_equals_d=False,
                      max_head_dim=MAX_HEAD_DIM, fully_masked_rows="zero", precision="flash", quantization=SCHEME,
                      devices=(device,), batch_invariant=True, nan_safe_masking=True)
    attention.__name__ = attention.__qualname__ = "triton_fp8_kv_blocks"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
