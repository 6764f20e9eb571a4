"""The backward pass of ``flashcheck:triton``: FA2-style recomputation in two deterministic Triton kernels.

With the forward's lse (natural log) and rounded output O, and D_i = dO_i . O_i (fp32, on the host):

    dK/dV kernel, one program per (key tile, batch * K/V head), looping over the group's query heads and
    every query tile:
        P  = exp2(S * log2(e) - lse * log2(e))      recomputed in fp32, 0 where a key is hidden
        dV += P_t^T dO                              P rounded to the input dtype, fp32 accumulation
        dP  = dO V^T                                fp32
        dS  = P (dP - D)                            fp32, and kept in fp32 (below)
        dK += dS^T Q                                fp32 products and accumulation; dK *= scale at the end
    dQ kernel, one program per (query tile, batch * query head), looping over the key tiles:
        dQ += dS K                                  fp32 products and accumulation; dQ *= scale at the end

dS is not rounded to the input dtype before its two matmuls, as FA2 does: |dS| passes fp16's 65,504
while every gradient is representable (large V with dO along O), and the rounding gives inf, then NaN.
Its matmuls run in IEEE fp32, also where the contract allows tf32 (tf32 may truncate dS by 2^-10).

Each gradient element is summed by one program in a fixed order (no atomics), so two identical calls
give the same bits. The masks are the forward's: tail rows and keys, causality, the boolean mask.
"""

from __future__ import annotations

import inspect
import threading

import torch

from .triton_cache import use_triton_cache, watch_compilations

__all__ = ["triton_attention_backward"]

_LOG2E = 1.4426950408889634


def _visible_py(offs_m, cols, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn,
                IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """Which (row, key) pairs of a tile are visible: in range, causality, the boolean mask (as the forward)."""
    visible = row_ok[:, None] & col_ok[None, :]
    if IS_CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
    if HAS_MASK:
        allowed = tl.load(m_base + offs_m[:, None] * stride_mm + cols[None, :] * stride_mn,
                          mask=row_ok[:, None] & col_ok[None, :], other=0)
        visible = visible & (allowed != 0)
    return visible


def _p_and_ds_py(q, k, v, do, lse2, delta, visible, qk_scale, INPUT_PRECISION: tl.constexpr):
    """P recomputed from the saved lse (base 2) and dS = P (dP - D), both fp32, 0 on hidden keys."""
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
    p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
    return p, tl.where(visible, p * (dp - delta[:, None]), 0.0)


def _dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, Mask,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    n_heads_kv, group, n_q, n_k, head_dim, head_dim_v, causal_offset, scale, qk_scale,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // n_heads_kv
    off_hkv = pid_bh % n_heads_kv
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    col_ok = offs_n < n_k
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < head_dim_v
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    k = tl.load(k_base + offs_n[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    v = tl.load(v_base + offs_n[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for g in range(0, group):
        off_h = off_hkv * group + g
        q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        l_base = Lse + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
        d_base = Delta + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
        m_base = Mask + off_b.to(tl.int64) * stride_mb + off_h.to(tl.int64) * stride_mh
        for start_m in range(0, n_q, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < n_q
            q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                         mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
            lse = tl.load(l_base + offs_m * stride_lm, mask=row_ok, other=0.0)
            delta = tl.load(d_base + offs_m * stride_lm, mask=row_ok, other=0.0)
            visible = _visible(offs_m, offs_n, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn,
                               IS_CAUSAL, HAS_MASK)
            # A row with no visible key has lse = -inf: every P of it is 0 through `visible`.
            lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
            p, ds = _p_and_ds(q, k, v, do, lse2, delta, visible, qk_scale, INPUT_PRECISION)
            dv = tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, dv, input_precision=INPUT_PRECISION)
            dk = tl.dot(tl.trans(ds), q.to(tl.float32), dk, input_precision="ieee")  # dS stays fp32
    dk = dk * scale
    dk_base = DK + off_b.to(tl.int64) * stride_dkb + off_hkv.to(tl.int64) * stride_dkh
    dv_base = DV + off_b.to(tl.int64) * stride_dvb + off_hkv.to(tl.int64) * stride_dvh
    tl.store(dk_base + offs_n[:, None] * stride_dkn + offs_d[None, :] * stride_dkd, dk.to(DK.dtype.element_ty),
             mask=col_ok[:, None] & d_ok[None, :])
    tl.store(dv_base + offs_n[:, None] * stride_dvn + offs_dv[None, :] * stride_dvd, dv.to(DV.dtype.element_ty),
             mask=col_ok[:, None] & dv_ok[None, :])


def _dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Mask,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    n_heads_q, group, n_q, n_k, head_dim, head_dim_v, causal_offset, scale, qk_scale,
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // n_heads_q
    off_h = pid_bh % n_heads_q
    off_hkv = off_h // group
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < n_q
    d_ok = offs_d < head_dim
    dv_ok = offs_dv < head_dim_v
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    do_base = DO + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    l_base = Lse + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
    d_base = Delta + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
    m_base = Mask + off_b.to(tl.int64) * stride_mb + off_h.to(tl.int64) * stride_mh
    q = tl.load(q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    do = tl.load(do_base + offs_m[:, None] * stride_dom + offs_dv[None, :] * stride_dod,
                 mask=row_ok[:, None] & dv_ok[None, :], other=0.0)
    lse = tl.load(l_base + offs_m * stride_lm, mask=row_ok, other=0.0)
    delta = tl.load(d_base + offs_m * stride_lm, mask=row_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        cols = start_n + offs_n0
        col_ok = cols < n_k
        k = tl.load(k_base + cols[:, None] * stride_kn + offs_d[None, :] * stride_kd,
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
                    mask=col_ok[:, None] & dv_ok[None, :], other=0.0)
        visible = _visible(offs_m, cols, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn,
                           IS_CAUSAL, HAS_MASK)
        p, ds = _p_and_ds(q, k, v, do, lse2, delta, visible, qk_scale, INPUT_PRECISION)
        dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")  # dS stays fp32
    dq = dq * scale
    dq_base = DQ + off_b.to(tl.int64) * stride_dqb + off_h.to(tl.int64) * stride_dqh
    tl.store(dq_base + offs_m[:, None] * stride_dqm + offs_d[None, :] * stride_dqd, dq.to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])


_LOCK = threading.Lock()
_JITTED: dict = {}


def _load():
    """(dK/dV kernel, dQ kernel), jitted once, with the forward's specialisation policy."""
    from .triton_flash import _load as load_forward

    triton, _, _ = load_forward()  # binds `tl` in that module; bind it here too
    import triton.language as tl_module

    with _LOCK:
        if not _JITTED:
            globals()["tl"] = tl_module
            globals()["_visible"] = triton.jit(_visible_py)  # the names the kernels call
            globals()["_p_and_ds"] = triton.jit(_p_and_ds_py)
            sizes = ("n_heads_kv", "n_heads_q", "group", "n_q", "n_k", "head_dim", "head_dim_v", "causal_offset")
            for name, fn in (("dkdv", _dkdv_kernel), ("dq", _dq_kernel)):
                params = inspect.signature(fn).parameters
                skip = tuple(p for p in params if p.startswith("stride_") or p in sizes)
                _JITTED[name] = triton.jit(fn, do_not_specialize=skip)
            use_triton_cache()
            watch_compilations()
        return triton, _JITTED["dkdv"], _JITTED["dq"]


def triton_attention_backward(q, k, v, out, lse, do, *, scale, causal, attn_mask, shapes, block_m: int,
                              block_n: int, block_d: int, block_dv: int, input_precision: str):
    """(dq, dk, dv) in q's dtype for the forward's ``out`` and ``lse`` and the upstream gradient ``do``."""
    triton, dkdv_kernel, dq_kernel = _load()
    B, Hq, Hkv, Nq, Nk = shapes.batch, shapes.heads_q, shapes.heads_kv, shapes.n_q, shapes.n_k
    do = do.to(q.dtype)
    delta = (do.float() * out.float()).sum(-1)  # D_i = dO_i . O_i from the rounded O, fp32
    lse = lse.contiguous()
    delta = delta.contiguous()
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty((B, Hkv, Nk, shapes.head_dim), dtype=q.dtype, device=q.device)
    dv = torch.empty((B, Hkv, Nk, shapes.head_dim_v), dtype=q.dtype, device=q.device)
    if attn_mask is not None:
        mask = torch.broadcast_to(attn_mask, (B, Hq, Nq, Nk)).view(torch.uint8)
        mask_strides = mask.stride()
    else:
        mask, mask_strides = q, (0, 0, 0, 0)
    causal_offset = {"none": 0, "top_left": 0, "bottom_right": Nk - Nq}[causal]
    common = dict(IS_CAUSAL=causal != "none", HAS_MASK=attn_mask is not None, BLOCK_M=block_m, BLOCK_N=block_n,
                  BLOCK_D=block_d, BLOCK_DV=block_dv, INPUT_PRECISION=input_precision)
    sizes = (shapes.group, Nq, Nk, shapes.head_dim, shapes.head_dim_v, causal_offset, scale, scale * _LOG2E)
    dkdv_kernel[(triton.cdiv(Nk, block_n), B * Hkv)](
        q, k, v, do, lse, delta, dk, dv, mask,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *dk.stride(), *dv.stride(),
        *mask_strides, Hkv, *sizes, **common)
    dq_kernel[(triton.cdiv(Nq, block_m), B * Hq)](
        q, k, v, do, lse, delta, dq, mask,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *dq.stride(),
        *mask_strides, Hq, *sizes, **common)
    return dq, dk, dv
