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
give the same bits. The masks are the forward's: tail rows and keys, causality, the window, the chunk,
the boolean mask.

Variants: a soft cap recomputes t = tanh(s / c) and S = c t as the forward does, and dS (of the capped
logits) becomes dS (1 - t^2) before its two matmuls. ALiBi and attn_bias are added to S after the cap, as
the forward adds them (the same bits); dS of the biased logits is dS of the capped ones, and -inf in
attn_bias hides its key as the mask does. attn_bias's gradient, when wanted, is that dS, written by the
dQ kernel and summed over the bias's broadcast dims on the host; the slopes get none. Sinks change nothing in the
kernels: the saved lse holds the sink, so P, D and dS are those of the keys; the sinks' own gradient,
-sum_{b,i} e^(sink - lse) D, is summed on the host.
"""

from __future__ import annotations

import inspect
import threading

import torch

from .arguments import alibi_offset, fp32_zero
from .cache import use_triton_cache, watch_compilations
from .functions import alibi_py, bias_py, bind, tanh_py
from .runtime import import_triton

__all__ = ["triton_attention_backward"]

_LOG2E = 1.4426950408889634


def _head_py(ptr, off_b, off_h, stride_b, stride_h):
    """The base of one (batch entry, head) of a tensor, in int64 (batch * stride passes 2^31)."""
    return ptr + off_b.to(tl.int64) * stride_b + off_h.to(tl.int64) * stride_h


def _tile_py(base, rows, cols, stride_r, stride_c, row_ok, col_ok):
    """A (rows, cols) tile; out-of-range elements load as 0."""
    return tl.load(base + rows[:, None] * stride_r + cols[None, :] * stride_c, mask=row_ok[:, None] & col_ok[None, :],
                   other=0.0)


def _store_tile_py(base, rows, cols, stride_r, stride_c, row_ok, col_ok, value):
    tl.store(base + rows[:, None] * stride_r + cols[None, :] * stride_c, value, mask=row_ok[:, None] & col_ok[None, :])


def _visible_py(offs_m, cols, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn, diagonal, window_left,
                window_right, chunk, has_window, has_chunk, IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr):
    """Which (row, key) pairs of a tile are visible: in range, causality, the window, the chunk, the boolean
    mask (as the forward)."""
    visible = row_ok[:, None] & col_ok[None, :]
    if IS_CAUSAL:
        visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
    if has_window:
        centre = offs_m[:, None] + diagonal
        visible = visible & (cols[None, :] >= centre - window_left) & (cols[None, :] <= centre + window_right)
    if has_chunk:
        pos = offs_m + diagonal  # // truncates: a position before the first key has no chunk
        first = pos // chunk * chunk
        visible = visible & (pos[:, None] >= 0) & (cols[None, :] >= first[:, None])
        visible = visible & (cols[None, :] < first[:, None] + chunk)
    if HAS_MASK:
        allowed = tl.load(m_base + offs_m[:, None] * stride_mm + cols[None, :] * stride_mn,
                          mask=row_ok[:, None] & col_ok[None, :], other=0)
        visible = visible & (allowed != 0)
    return visible


def _biases_py(offs_m, cols, row_ok, col_ok, visible, slope2, b_base, stride_bm, stride_bn, alibi_offset,
               ALIBI_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr):
    """(ALiBi, attn_bias, visible) of a tile: the biases in the base-2 domain as the forward adds them (ALiBi
    of slope 0 and attn_bias 0.0 where absent), and `visible` less the keys attn_bias's -inf hides."""
    bias2 = 0.0
    alibi2 = _alibi(offs_m + alibi_offset, cols, slope2, ALIBI_LINEAR)  # a tensor either way: has_alibi is runtime
    if HAS_BIAS:
        b = _bias(b_base, offs_m, cols, stride_bm, stride_bn, row_ok, col_ok)
        visible = visible & (b != float("-inf"))
        bias2 = b * 1.4426950408889634
    return alibi2, bias2, visible


def _p_and_ds_py(q, k, v, do, lse2, delta, visible, alibi2, bias2, qk_scale, softcap2, has_softcap, has_alibi,
                 HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """P recomputed from the saved lse (base 2), dS = P (dP - D) times the cap's slope when capped (dS of the
    logits before the cap) and dS of the biased logits, all fp32, 0 on hidden keys. The biases join after the
    cap (cap_first)."""
    s = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * qk_scale
    t = s  # defined on both sides of the runtime test: read only when capped
    if has_softcap:
        t = _tanh(s / softcap2)
        s = softcap2 * t
    if has_alibi:
        s = s + alibi2
    if HAS_BIAS:
        s = s + bias2
    p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
    ds = tl.where(visible, p * (dp - delta[:, None]), 0.0)
    ds_logits = ds  # of the biased logits: attn_bias's gradient
    if has_softcap:
        ds = ds * (1.0 - t * t)  # d(c tanh(s / c)) / ds
    return p, ds, ds_logits


def _dkdv_kernel(
    Q, K, V, DO, Lse, Delta, DK, DV, Mask, Slopes, Bias,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dkb, stride_dkh, stride_dkn, stride_dkd,
    stride_dvb, stride_dvh, stride_dvn, stride_dvd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_sb, stride_sh, stride_bb, stride_bh, stride_bm, stride_bn,
    n_heads_kv, group, n_q, n_k, head_dim, head_dim_v, causal_offset, scale, qk_scale,
    diagonal, window_left, window_right, chunk, softcap2, alibi_offset,
    has_softcap, has_window, has_chunk, has_alibi,  # runtime flags: one compiled kernel for every mix of them
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ALIBI_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
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
    k = _tile(_head(K, off_b, off_hkv, stride_kb, stride_kh), offs_n, offs_d, stride_kn, stride_kd, col_ok, d_ok)
    v = _tile(_head(V, off_b, off_hkv, stride_vb, stride_vh), offs_n, offs_dv, stride_vn, stride_vd, col_ok, dv_ok)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for g in range(0, group):
        off_h = off_hkv * group + g
        q_base = _head(Q, off_b, off_h, stride_qb, stride_qh)
        do_base = _head(DO, off_b, off_h, stride_dob, stride_doh)
        l_base = _head(Lse, off_b, off_h, stride_lb, stride_lh)
        d_base = _head(Delta, off_b, off_h, stride_lb, stride_lh)
        m_base = _head(Mask, off_b, off_h, stride_mb, stride_mh)
        b_base = _head(Bias, off_b, off_h, stride_bb, stride_bh)
        slope2 = tl.load(Slopes + off_b * stride_sb + off_h * stride_sh) * 1.4426950408889634  # 0: no ALiBi
        for start_m in range(0, n_q, BLOCK_M):
            offs_m = start_m + offs_m0
            row_ok = offs_m < n_q
            q = _tile(q_base, offs_m, offs_d, stride_qm, stride_qd, row_ok, d_ok)
            do = _tile(do_base, offs_m, offs_dv, stride_dom, stride_dod, row_ok, dv_ok)
            lse = tl.load(l_base + offs_m * stride_lm, mask=row_ok, other=0.0)
            delta = tl.load(d_base + offs_m * stride_lm, mask=row_ok, other=0.0)
            visible = _visible(offs_m, offs_n, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn, diagonal,
                               window_left, window_right, chunk, has_window, has_chunk, IS_CAUSAL, HAS_MASK)
            # A row with no visible key has lse = -inf: every P of it is 0 through `visible`.
            lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
            alibi2, bias2, visible = _biases(offs_m, offs_n, row_ok, col_ok, visible, slope2, b_base, stride_bm,
                                             stride_bn, alibi_offset, ALIBI_LINEAR, HAS_BIAS)
            p, ds, _ = _p_and_ds(q, k, v, do, lse2, delta, visible, alibi2, bias2, qk_scale, softcap2, has_softcap,
                              has_alibi, HAS_BIAS, INPUT_PRECISION)
            dv = tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, dv, input_precision=INPUT_PRECISION)
            dk = tl.dot(tl.trans(ds), q.to(tl.float32), dk, input_precision="ieee")  # dS stays fp32
    dk = dk * scale
    _store_tile(_head(DK, off_b, off_hkv, stride_dkb, stride_dkh), offs_n, offs_d, stride_dkn, stride_dkd,
                col_ok, d_ok, dk.to(DK.dtype.element_ty))
    _store_tile(_head(DV, off_b, off_hkv, stride_dvb, stride_dvh), offs_n, offs_dv, stride_dvn, stride_dvd,
                col_ok, dv_ok, dv.to(DV.dtype.element_ty))


def _dq_kernel(
    Q, K, V, DO, Lse, Delta, DQ, Mask, Slopes, Bias, DB,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_dob, stride_doh, stride_dom, stride_dod,
    stride_lb, stride_lh, stride_lm,
    stride_dqb, stride_dqh, stride_dqm, stride_dqd,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_sb, stride_sh, stride_bb, stride_bh, stride_bm, stride_bn,
    stride_dbb, stride_dbh, stride_dbm, stride_dbn,
    n_heads_q, group, n_q, n_k, head_dim, head_dim_v, causal_offset, scale, qk_scale,
    diagonal, window_left, window_right, chunk, softcap2, alibi_offset,
    has_softcap, has_window, has_chunk, has_alibi,  # runtime flags: one compiled kernel for every mix of them
    IS_CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ALIBI_LINEAR: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_DBIAS: tl.constexpr,
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
    k_base = _head(K, off_b, off_hkv, stride_kb, stride_kh)
    v_base = _head(V, off_b, off_hkv, stride_vb, stride_vh)
    l_base = _head(Lse, off_b, off_h, stride_lb, stride_lh)
    d_base = _head(Delta, off_b, off_h, stride_lb, stride_lh)
    m_base = _head(Mask, off_b, off_h, stride_mb, stride_mh)
    b_base = _head(Bias, off_b, off_h, stride_bb, stride_bh)
    db_base = _head(DB, off_b, off_h, stride_dbb, stride_dbh)
    slope2 = tl.load(Slopes + off_b * stride_sb + off_h * stride_sh) * 1.4426950408889634  # 0: no ALiBi
    q = _tile(_head(Q, off_b, off_h, stride_qb, stride_qh), offs_m, offs_d, stride_qm, stride_qd, row_ok, d_ok)
    do = _tile(_head(DO, off_b, off_h, stride_dob, stride_doh), offs_m, offs_dv, stride_dom, stride_dod, row_ok, dv_ok)
    lse = tl.load(l_base + offs_m * stride_lm, mask=row_ok, other=0.0)
    delta = tl.load(d_base + offs_m * stride_lm, mask=row_ok, other=0.0)
    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        cols = start_n + offs_n0
        col_ok = cols < n_k
        k = _tile(k_base, cols, offs_d, stride_kn, stride_kd, col_ok, d_ok)
        v = _tile(v_base, cols, offs_dv, stride_vn, stride_vd, col_ok, dv_ok)
        visible = _visible(offs_m, cols, row_ok, col_ok, causal_offset, m_base, stride_mm, stride_mn, diagonal,
                           window_left, window_right, chunk, has_window, has_chunk, IS_CAUSAL, HAS_MASK)
        alibi2, bias2, visible = _biases(offs_m, cols, row_ok, col_ok, visible, slope2, b_base, stride_bm, stride_bn,
                                         alibi_offset, ALIBI_LINEAR, HAS_BIAS)
        p, ds, ds_logits = _p_and_ds(q, k, v, do, lse2, delta, visible, alibi2, bias2, qk_scale, softcap2, has_softcap,
                          has_alibi, HAS_BIAS, INPUT_PRECISION)
        dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")  # dS stays fp32
        if HAS_DBIAS:  # each (row, key) once: the host sums the bias's broadcast dims
            _store_tile(db_base, offs_m, cols, stride_dbm, stride_dbn, row_ok, col_ok, ds_logits)
    dq = dq * scale
    _store_tile(_head(DQ, off_b, off_h, stride_dqb, stride_dqh), offs_m, offs_d, stride_dqm, stride_dqd,
                row_ok, d_ok, dq.to(DQ.dtype.element_ty))


_LOCK = threading.Lock()
_JITTED: dict = {}


_UNSPECIALISED = ("n_heads_kv", "n_heads_q", "group", "n_q", "n_k", "head_dim", "head_dim_v", "causal_offset",
                  "diagonal", "window_left", "window_right", "chunk", "alibi_offset", "has_softcap", "has_window",
                  "has_chunk", "has_alibi")


def jit_options(fn) -> dict:
    """The forward's specialisation policy for a backward kernel: no sizes, strides or variant flags."""
    params = inspect.signature(fn).parameters
    return {"do_not_specialize": tuple(p for p in params if p.startswith("stride_") or p in _UNSPECIALISED)}


def _load():
    """(dK/dV kernel, dQ kernel), jitted once, with the forward's specialisation policy."""
    triton, tl_module = import_triton()
    with _LOCK:
        if not _JITTED:
            globals()["tl"] = tl_module
            bind(tl_module)
            # The forward's device functions, for the same bits, and the backward's own.
            for helper in (tanh_py, alibi_py, bias_py, _head_py, _tile_py, _store_tile_py, _visible_py, _biases_py,
                           _p_and_ds_py):
                globals()["_" + helper.__name__[:-3].lstrip("_")] = triton.jit(helper)  # the names the kernels call
            for name, fn in (("dkdv", _dkdv_kernel), ("dq", _dq_kernel)):
                _JITTED[name] = triton.jit(fn, **jit_options(fn))
            use_triton_cache()
            watch_compilations()
        return triton, _JITTED["dkdv"], _JITTED["dq"]


_PLANS: dict = {}  # (device, dtype, tile sizes, constexprs) -> the launch plan that fit


def _plans(block_m: int, block_n: int):
    """Launch plans ``(block_m, block_n, num_stages)`` to try in turn: the forward's tiles with Triton's
    default pipeline, then one stage, then halved tiles. Both kernels keep five tiles and two fp32
    products in shared memory, so fp32 with 128-wide heads at 64 x 64 does not fit an H200's 227 KiB."""
    yield block_m, block_n, None
    while True:
        yield block_m, block_n, 1
        if block_m == block_n == 16:
            return
        block_m, block_n = (max(16, block_m // 2), block_n) if block_m >= block_n else (block_m, max(16, block_n // 2))


def _launch(triton, kernel, grid_of, args, key, *, block_m, block_n, **common):
    """Launch ``kernel`` with the first plan whose tiles fit (remembered per ``key``)."""
    if key in _PLANS:
        plans = [_PLANS[key]]
    else:
        plans = _plans(block_m, block_n)
    out_of_resources = getattr(getattr(triton.runtime, "errors", None), "OutOfResources", ())
    for bm, bn, stages in plans:
        launch = dict(common, BLOCK_M=bm, BLOCK_N=bn) | ({} if stages is None else {"num_stages": stages})
        try:
            kernel[grid_of(bm, bn)](*args, **launch)
        except out_of_resources:
            continue
        _PLANS[key] = (bm, bn, stages)
        return
    raise RuntimeError(f"no tile of the Triton backward fits this GPU's shared memory ({key})")


def _sinks_gradient(sinks, lse, delta):
    """-sum over batch and rows of P(sink) D, P(sink) = e^(sink - lse): the sink is a key of value 0, so its
    dS = P (0 - D). P(sink) = 0 where lse = -inf (no visible key, a sink of -inf), not e^(-inf + inf)."""
    p = torch.exp(sinks.detach().float()[None, :, None] - lse)
    p = torch.where(lse == float("-inf"), 0.0, p)
    return -(p * delta).sum(dim=(0, 2)).to(sinks.dtype)


def triton_attention_backward(q, k, v, out, lse, do, *, scale, causal, attn_mask, shapes, block_m: int,
                              block_n: int, block_d: int, block_dv: int, input_precision: str, softcap=None,
                              window=None, chunk=None, sinks=None, alibi_slopes=None, attn_bias=None,
                              alibi="symmetric", bias_shape=None):
    """(dq, dk, dv, dsinks, dbias), the first three in q's dtype, for the forward's ``out`` and ``lse`` and the
    upstream gradient ``do``.

    ``softcap``, ``window``, ``chunk``, ``alibi_slopes`` and ``attn_bias`` as the forward's host puts them (no
    inf cap, window sides of -1 resolved, slopes (B, Hq) fp32, the bias broadcast to (B, Hq, Nq, Nk)), ``alibi``
    their mode; ``sinks``: the forward's, when their gradient is wanted (then dsinks, else None); ``bias_shape``:
    the caller's attn_bias shape, when its gradient is wanted (then dbias, in its dtype, else None).
    """
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
    common = dict(IS_CAUSAL=causal != "none", HAS_MASK=attn_mask is not None, ALIBI_LINEAR=alibi == "linear",
                  HAS_BIAS=attn_bias is not None, BLOCK_D=block_d, BLOCK_DV=block_dv, INPUT_PRECISION=input_precision)
    key = (str(q.device), q.dtype, block_m, block_n, *common.values())
    window_left, window_right = (0, 0) if window is None else window  # never read without a window
    sizes = (shapes.group, Nq, Nk, shapes.head_dim, shapes.head_dim_v, causal_offset, scale, scale * _LOG2E,
             Nk - Nq, window_left, window_right, chunk or 1, 1.0 if softcap is None else softcap * _LOG2E,
             alibi_offset(alibi, Nq, Nk), *(int(t is not None) for t in (softcap, window, chunk, alibi_slopes)))
    # Absent slopes read as one fp32 zero (a slope of 0 adds 0); q is never read as the bias (HAS_BIAS is False).
    biases = (fp32_zero(q) if alibi_slopes is None else alibi_slopes, q if attn_bias is None else attn_bias,
              *(alibi_slopes.stride() if alibi_slopes is not None else (0, 0)),
              *(attn_bias.stride() if attn_bias is not None else (0, 0, 0, 0)))
    _launch(triton, dkdv_kernel, lambda bm, bn: (triton.cdiv(Nk, bn), B * Hkv),
            (q, k, v, do, lse, delta, dk, dv, mask, *biases[:2],
             *q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *dk.stride(), *dv.stride(),
             *mask_strides, *biases[2:], Hkv, *sizes), ("dkdv",) + key, block_m=block_m, block_n=block_n, **common)
    # dS of the biased logits, (B, Hq, Nq, Nk) fp32, when the bias's gradient is wanted; q is never written else.
    dbias = None if bias_shape is None else torch.empty((B, Hq, Nq, Nk), dtype=torch.float32, device=q.device)
    db = (q, 0, 0, 0, 0) if dbias is None else (dbias, *dbias.stride())
    _launch(triton, dq_kernel, lambda bm, bn: (triton.cdiv(Nq, bm), B * Hq),
            (q, k, v, do, lse, delta, dq, mask, *biases[:2], db[0],
             *q.stride(), *k.stride(), *v.stride(), *do.stride(), *lse.stride(), *dq.stride(),
             *mask_strides, *biases[2:], *db[1:], Hq, *sizes), ("dq", dbias is not None) + key,
            block_m=block_m, block_n=block_n, HAS_DBIAS=dbias is not None, **common)
    dsinks = None if sinks is None else _sinks_gradient(sinks, lse, delta)
    # attn_bias's gradient: dS summed over the dims the bias broadcasts, in its shape and dtype.
    return dq, dk, dv, dsinks, None if dbias is None else dbias.sum_to_size(bias_shape).to(attn_bias.dtype)
