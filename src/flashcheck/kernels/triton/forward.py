"""flashcheck's own Triton flash-attention forward kernel (``flashcheck:triton``).

The algorithm, one program per (query tile, batch * query head):

1. score tile      s = (Q_tile @ K_tile^T) * scale * log2(e), fp32 accumulation (base-2 domain);
                   soft-capped to c tanh(s / c) (c in the base-2 domain too) before any mask, then
                   biased: ALiBi and attn_bias, times log2(e), added after the cap (cap_first)
2. masking         out-of-range keys, causality, the window, the chunk, the boolean mask and attn_bias's
                   -inf entries set s to -inf
3. running max     m_new = max(m, rowmax(s))
4. rescale         alpha = exp2(m - m_new); l = l * alpha + rowsum(p); acc = acc * alpha
5. P cast          p = exp2(s - m_new) in fp32, rounded to the input dtype for the second matmul
6. P @ V           acc += p @ V_tile, fp32 accumulation
7. normalise       out = acc / l, rounded to the input dtype
8. lse             lse = (m + log2(l)) * ln(2), natural log, fp32

Sinks join after the last key tile, as one more key of logit sink and value 0: m = max(m, sink), l and
acc rescaled to it, l += exp2(sink - m).

m, l and acc stay in fp32. A row with no visible key keeps m = -inf and l = 0; it comes out as
out = 0 and lse = -inf (lse = sink with a sink), never NaN. Key tiles that causality or the window's
right side hides from every row of a query tile are skipped; the diagonal and tail tiles are handled
with masks. Each variant is a constexpr, so plain attention runs the very code it ran without them.

Triton is imported on the first call, never at import time: the interpreter (``TRITON_INTERPRET=1``)
is chosen when a kernel is jitted, so whatever the environment says at the first call decides it for
the whole process. CPU tensors are accepted only under the interpreter.
"""

from __future__ import annotations

import inspect
import math
import threading

import torch

from ...contract.counts import check_count
from ...contract.formats import DTYPES
from ...contract.spec import Kernel, KernelSpec
from ...contract.validation import CAUSAL_MODES, check_attention_inputs
from ...features.variant import ALIBI_MODES, Variant
from ...errors import BackendUnavailable, InvalidArgument
from .arguments import alibi_offset, fp32_zero
from .backward import triton_attention_backward
from .cache import use_triton_cache, watch_compilations
from .functions import alibi_py, bias_py, bind, tanh_py
from .runtime import BACKEND_NAME, import_triton, triton_dtypes

__all__ = [
    "INPUT_PRECISIONS",
    "MAX_HEAD_DIM",
    "MIN_HEAD_DIM",
    "jitted_for_the_gpu",
    "make_kernel",
    "on_device",
    "triton_attention",
]

INPUT_PRECISIONS = ("tf32", "ieee")
MIN_HEAD_DIM = 16  # tl.dot needs every operand dimension >= 16
MAX_HEAD_DIM = 256  # a (BLOCK_M, 256) fp32 accumulator is the most a tile holds in registers
MIN_BLOCK, MAX_BLOCK = 16, 256
_NUM_WARPS = (1, 2, 4, 8, 16, 32)
_MAX_GRID_Y = 65535  # CUDA's limit on the second grid dimension (batch * query heads)
_LOG2E = 1.0 / math.log(2.0)


# --------------------------------------------------------------------------------------------------
# The kernel. It is written at module level (so Triton can read its source) but only jitted by
# _load(): the annotations are strings thanks to ``from __future__ import annotations``, and the
# global ``tl`` it uses is bound by _load() when triton is imported.
# --------------------------------------------------------------------------------------------------


_SIZE_ARGUMENTS = ("n_heads_q", "group", "n_q", "n_k", "head_dim", "head_dim_v", "causal_offset", "diagonal",
                   "window_left", "window_right", "chunk", "alibi_offset",
                   "has_softcap", "has_window", "has_chunk", "has_alibi", "has_sinks")


def _flash_attention_fwd(
    Q, K, V, Out, Lse, Mask, Sinks, Slopes, Bias,
    stride_qb, stride_qh, stride_qm, stride_qd,
    stride_kb, stride_kh, stride_kn, stride_kd,
    stride_vb, stride_vh, stride_vn, stride_vd,
    stride_ob, stride_oh, stride_om, stride_od,
    stride_lb, stride_lh, stride_lm,
    stride_mb, stride_mh, stride_mm, stride_mn,
    stride_sb, stride_sh,  # the slopes, (B, Hq) fp32 (stride_sb = 0 for slopes of shape (Hq,))
    stride_bb, stride_bh, stride_bm, stride_bn,  # attn_bias broadcast to (B, Hq, Nq, Nk): 0 on broadcast dims
    n_heads_q, group, n_q, n_k, head_dim, head_dim_v,
    causal_offset,  # causal: key j is visible to query i iff j <= i + causal_offset
    qk_scale,  # softmax scale * log2(e): scores live in the base-2 domain so exp2 can be used
    diagonal,  # n_k - n_q: the window and the chunks are aligned bottom-right
    window_left, window_right,  # window: key j visible to query i iff -left <= j - (i + diagonal) <= right
    chunk,  # chunks: key j visible to query i iff j is in the chunk of position i + diagonal
    softcap2,  # the soft cap c * log2(e): c tanh(s / c) in the base-2 domain
    alibi_offset,  # ALiBi's distance is j - (i + alibi_offset): Nk - Nq (symmetric), 0 (linear)
    # The variants that add no tensor of their own are runtime flags (0 or 1), not constexprs: one compiled
    # kernel serves every mix of them, where constexprs compiled one per mix a campaign draws.
    has_softcap, has_window, has_chunk, has_alibi, has_sinks,
    IS_CAUSAL: tl.constexpr,
    HAS_MASK: tl.constexpr,
    ALIBI_LINEAR: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    off_b = pid_bh // n_heads_q
    off_h = pid_bh % n_heads_q
    off_hkv = off_h // group  # GQA: `group` query heads share one key/value head

    # Base pointers in int64: batch * stride passes 2^31 elements on large tensors.
    q_base = Q + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    k_base = K + off_b.to(tl.int64) * stride_kb + off_hkv.to(tl.int64) * stride_kh
    v_base = V + off_b.to(tl.int64) * stride_vb + off_hkv.to(tl.int64) * stride_vh
    o_base = Out + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    l_base = Lse + off_b.to(tl.int64) * stride_lb + off_h.to(tl.int64) * stride_lh
    m_base = Mask + off_b.to(tl.int64) * stride_mb + off_h.to(tl.int64) * stride_mh
    b_base = Bias + off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh
    # Without ALiBi the host passes a slope of 0, so the load is always in bounds.
    slope2 = tl.load(Slopes + off_b * stride_sb + off_h * stride_sh) * 1.4426950408889634

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    row_ok = offs_m < n_q
    d_ok = offs_d < head_dim  # head dims are padded up to a power of two
    dv_ok = offs_dv < head_dim_v

    # Padded rows and columns load as 0: they add nothing to Q @ K^T.
    q = tl.load(
        q_base + offs_m[:, None] * stride_qm + offs_d[None, :] * stride_qd,
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    # Causal and the window's right side: stop after the last key that the last real row of this tile
    # can see; tiles past it are fully masked and skipped. hi = 0 (no key visible at all) runs no
    # iteration.
    hi = n_k
    last_row = tl.minimum(pid_m * BLOCK_M + BLOCK_M, n_q) - 1
    if IS_CAUSAL:
        hi = tl.minimum(n_k, tl.maximum(last_row + causal_offset + 1, 0))
    if has_window:
        hi = tl.minimum(hi, tl.maximum(last_row + diagonal + window_right + 1, 0))

    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < n_k

        # -- 1. score tile: K is loaded transposed, (BLOCK_D, BLOCK_N) ---------------------------
        k = tl.load(
            k_base + cols[None, :] * stride_kn + offs_d[:, None] * stride_kd,
            mask=d_ok[:, None] & col_ok[None, :],
            other=0.0,
        )
        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale
        if has_softcap:
            # Before the masks: capped after them, a hidden key's -inf would become -c and get weight.
            s = softcap2 * _tanh(s / softcap2)
        # The biases after the cap (cap_first, flash-attention's order), in the base-2 domain.
        if has_alibi:
            s = s + _alibi(offs_m + alibi_offset, cols, slope2, ALIBI_LINEAR)
        if HAS_BIAS:
            b = _bias(b_base, offs_m, cols, stride_bm, stride_bn, row_ok, col_ok)
            s = s + b * 1.4426950408889634

        # -- 2. masking: tail keys, causality, the window, the chunk, the boolean mask ---------------
        visible = row_ok[:, None] & col_ok[None, :]
        if IS_CAUSAL:
            visible = visible & (cols[None, :] <= offs_m[:, None] + causal_offset)
        if has_window:
            centre = offs_m[:, None] + diagonal
            visible = visible & (cols[None, :] >= centre - window_left) & (cols[None, :] <= centre + window_right)
        if has_chunk:
            # // truncates toward zero, so a position before the first key (Nq > Nk) would land in
            # chunk 0: such rows see no key, by a test of their own.
            pos = offs_m + diagonal
            first = pos // chunk * chunk
            visible = visible & (pos[:, None] >= 0) & (cols[None, :] >= first[:, None])
            visible = visible & (cols[None, :] < first[:, None] + chunk)
        if HAS_MASK:
            allowed = tl.load(
                m_base + offs_m[:, None] * stride_mm + cols[None, :] * stride_mn,
                mask=row_ok[:, None] & col_ok[None, :],
                other=0,
            )
            visible = visible & (allowed != 0)
        if HAS_BIAS:
            visible = visible & (b != float("-inf"))  # as a mask's False: V not read, a row of them empty
        # where (not an additive -inf bias) so a NaN or inf in a hidden key cannot leak in.
        s = tl.where(visible, s, float("-inf"))

        # -- 3. running max ------------------------------------------------------------------------
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row with no visible key so far has m_new = -inf; subtracting 0 instead makes exp2 give
        # 0 for every key (and for alpha) rather than exp2(-inf - -inf) = NaN.
        m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)

        # -- 4. rescale the running sum and the accumulator to the new max -------------------------
        alpha = tl.math.exp2(m_i - m_sub)
        p = tl.math.exp2(s - m_sub[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None]

        # -- 5. P cast: the unnormalised P is rounded to the input dtype for the second matmul ------
        p_lo = p.to(V.dtype.element_ty)

        # -- 6. P @ V ------------------------------------------------------------------------------
        # Keys that no row of this tile sees are not read: a NaN stored there (padding) would otherwise
        # turn into 0 * NaN = NaN inside the dot.
        v_ok = col_ok & (tl.max(visible.to(tl.int32), axis=0) > 0)
        v = tl.load(
            v_base + cols[:, None] * stride_vn + offs_dv[None, :] * stride_vd,
            mask=v_ok[:, None] & dv_ok[None, :],
            other=0.0,
        )
        acc = tl.dot(p_lo, v, acc, input_precision=INPUT_PRECISION)
        m_i = m_new

    if has_sinks:
        # The sink as one more key, of value 0. A sink of -inf changes no bit: the max stays, beta =
        # exp2(0) = 1 and the sink adds exp2(-inf) = 0; a row with no key either keeps l = 0.
        sink2 = tl.load(Sinks + off_h) * 1.4426950408889634
        m_fin = tl.maximum(m_i, sink2)
        m_fsub = tl.where(m_fin == float("-inf"), 0.0, m_fin)
        beta = tl.math.exp2(m_i - m_fsub)
        l_i = l_i * beta + tl.math.exp2(sink2 - m_fsub)
        acc = acc * beta[:, None]
        m_i = m_fin

    # -- 7. final normalisation: a row with no visible key has acc = 0, l = 0 and comes out 0 ------
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    out = acc / l_safe[:, None]
    tl.store(
        o_base + offs_m[:, None] * stride_om + offs_dv[None, :] * stride_od,
        out.to(Out.dtype.element_ty),
        mask=row_ok[:, None] & dv_ok[None, :],
    )

    # -- 8. lse, natural log: m is in the base-2 domain, so lse = (m + log2 l) * ln 2 ----------------
    lse = tl.where(l_i == 0.0, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(l_base + offs_m * stride_lm, lse, mask=row_ok)


_STRIDE_ARGUMENTS = tuple(p for p in inspect.signature(_flash_attention_fwd).parameters if p.startswith("stride_"))
# Sizes and strides change from case to case: specialising on them (== 1, divisible by 16) would
# compile a variant per class of lengths and layouts a campaign draws, for speed a correctness test
# has no use for. Left to specialise on: the constexprs (dtype, causal, mask, tile sizes) and pointer
# alignment. Measured on an H200 (Triton 3.6) over the 40 cases of a smoke campaign, property reruns
# included: 53 variants and 56 s of compiling with sizes alone unspecialised, 17 and 18 s with strides too.
_JIT_OPTIONS = {"do_not_specialize": _SIZE_ARGUMENTS + _STRIDE_ARGUMENTS}


# --------------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------------

_LOCK = threading.Lock()
_JITTED: dict = {}


def _load():
    """Import triton and jit the kernel once; return ``(triton, kernel, interpreted)``."""
    with _LOCK:
        if not _JITTED:
            triton, tl = import_triton()
            globals()["tl"] = tl  # the kernel's source refers to the global `tl`
            bind(tl)
            for name, fn in (("_tanh", tanh_py), ("_alibi", alibi_py), ("_bias", bias_py)):
                globals()[name] = triton.jit(fn)  # the names the kernel calls
            kernel = triton.jit(_flash_attention_fwd, **_JIT_OPTIONS)
            use_triton_cache()
            watch_compilations()  # from the first compilation on
            _JITTED.update(
                triton=triton,
                kernel=kernel,
                # The interpreter is decided when jitting, from TRITON_INTERPRET at that moment.
                interpreted=type(kernel).__name__ == "InterpretedFunction",
            )
        return _JITTED["triton"], _JITTED["kernel"], _JITTED["interpreted"]


def jitted_for_the_gpu() -> bool:
    """Whether this process jitted the kernel compiled, not interpreted: too late then to switch to the Triton
    interpreter (Triton decides when a kernel is jitted, and flashcheck jits on the first call)."""
    return bool(_JITTED) and not _JITTED.get("interpreted", False)


def _check_block(name: str, value: object) -> int:
    fix = f"Pass {name} as one of 16, 32, 64, 128 or 256."
    check_count(name, value, minimum=MIN_BLOCK, maximum=MAX_BLOCK, what="a tile size", fix=fix)
    if value & (value - 1):
        raise InvalidArgument(name, value, f"a tile size must be a power of two from {MIN_BLOCK} to {MAX_BLOCK}", fix)
    return value


def _check_options(*, block_m, block_n, num_warps, num_stages, input_precision, alibi="symmetric") -> None:
    _check_block("block_m", block_m)
    _check_block("block_n", block_n)
    if num_warps is not None and (isinstance(num_warps, bool) or num_warps not in _NUM_WARPS):
        raise InvalidArgument("num_warps", num_warps, "Triton needs a power of two from 1 to 32",
                              "Pass num_warps as one of 1, 2, 4, 8, 16, 32, or None for Triton's default.")
    check_count("num_stages", num_stages, none_ok=True, fix="Pass num_stages as an int >= 1, or None for Triton's default.")
    if input_precision not in INPUT_PRECISIONS:
        raise InvalidArgument(
            "input_precision", input_precision, "unknown tl.dot input precision",
            f"Use one of {list(INPUT_PRECISIONS)}: 'tf32' (fp32 matmuls as tf32 on the GPU) or "
            "'ieee' (true fp32).",
        )
    if alibi not in ALIBI_MODES:
        raise InvalidArgument("alibi", alibi, "unknown ALiBi mode",
                              f"Use one of {list(ALIBI_MODES)}: 'symmetric' (-slope |i + Nk - Nq - j|, "
                              "flash-attention's) or 'linear' (slope (j - i)).")


def _check_head_dim(name: str, tensor: torch.Tensor, dim: int, what: str, low: int) -> None:
    if not low <= dim <= MAX_HEAD_DIM:
        raise InvalidArgument(
            name, tensor, f"{what} {dim} outside the supported range {low}..{MAX_HEAD_DIM}",
            f"flashcheck:triton supports {what} from {low} to {MAX_HEAD_DIM} "
            "(any integer in between; pad the head dim or use another kernel).",
        )


def _padded(dim: int) -> int:
    """The next power of two >= dim (and >= 16, tl.dot's minimum)."""
    return max(MIN_BLOCK, 1 << (dim - 1).bit_length())


def _value_tile(head_dim_v: int, block_d: int) -> int:
    """Columns of the V tile: Dv padded, and never narrower than the Q/K tile unless 64 wide or more.

    Triton 3.6 on Hopper (H200) miscompiles P @ V for fp16/bf16 when the V tile is at most 32 columns
    and narrower than the Q/K tile, with 64 x 64, 128 x 64 and 64 x 128 tiles: every output element
    wrong from 63 keys on, and wgmma reads past the V buffer in shared memory (illegal memory access).
    A flashcheck campaign found it (reports/gpu-h200-2026-11-29-run2/triton-small-value-tiles.txt). The
    padded columns are masked on load and store, so only the speed of P @ V changes.
    """
    return max(_padded(head_dim_v), min(block_d, 64))


def _default_num_stages(device: torch.device, *, block_m, block_n, block_d, block_dv, itemsize) -> int:
    """Triton's default of 3 pipeline stages, fewer when the K/V buffers would not fit shared memory.

    The software pipeline keeps one K tile and one V tile per stage; Q and P sit beside them (this
    estimate matched Triton 3.9's allocation for sm_90 within a few KiB). A tenth of the shared
    memory is left as headroom for Triton's own scratch.
    """
    props = torch.cuda.get_device_properties(device)
    limit = getattr(props, "shared_memory_per_block_optin", 0) or 48 * 1024
    per_stage = block_n * (block_d + block_dv) * itemsize
    fixed = block_m * (block_d + block_n) * itemsize
    for stages in (3, 2):
        if fixed + stages * per_stage <= 0.9 * limit:
            return stages
    return 1


def _sinks(sinks, q, heads_q: int):
    """The sinks as the kernel reads them, fp32 and contiguous; their values are the caller's (a check for
    NaN would wait on the GPU)."""
    if sinks is None:
        return None
    fix = f"Pass sinks as a float32 tensor of shape ({heads_q},), one logit per query head, on q's device."
    if not isinstance(sinks, torch.Tensor) or tuple(sinks.shape) != (heads_q,) or not sinks.is_floating_point():
        raise InvalidArgument("sinks", sinks, f"expected a floating-point tensor of shape ({heads_q},)", fix)
    if sinks.device != q.device:
        raise InvalidArgument("sinks", sinks, f"on {sinks.device}, q on {q.device}", fix)
    return sinks.detach().to(torch.float32).contiguous()


def _on_device(name: str, tensor, q, fix: str) -> None:
    if tensor.device != q.device:
        raise InvalidArgument(name, tensor, f"on {tensor.device}, q on {q.device}", fix)


def _slopes(slopes, q, shapes):
    """The ALiBi slopes as the kernels read them, fp32 (B, Hq) (stride 0 over the batch for (Hq,))."""
    if slopes is None:
        return None
    B, Hq = shapes.batch, shapes.heads_q
    fix = f"Pass alibi_slopes as a float32 tensor of shape ({Hq},) or ({B}, {Hq}) on q's device."
    if not isinstance(slopes, torch.Tensor) or tuple(slopes.shape) not in ((Hq,), (B, Hq)) \
            or not slopes.is_floating_point():
        raise InvalidArgument("alibi_slopes", slopes, f"expected a floating-point tensor of shape ({Hq},) or "
                              f"({B}, {Hq})", fix)
    _on_device("alibi_slopes", slopes, q, fix)
    return slopes.detach().to(torch.float32).expand(B, Hq)


def _attn_bias(bias, q, shapes):
    """attn_bias broadcast to (B, Hq, Nq, Nk) (stride 0 on its broadcast dims, nothing copied), in q's dtype
    or fp32: the kernels convert it to fp32 as they load it."""
    if bias is None:
        return None
    full = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k)
    fix = f"Pass attn_bias as a tensor broadcastable to {full} (B, Hq, Nq, Nk), in q's dtype or float32, on q's device."
    if not isinstance(bias, torch.Tensor) or bias.dtype not in (q.dtype, torch.float32) or not 1 <= bias.dim() <= 4:
        raise InvalidArgument("attn_bias", bias, f"expected a {q.dtype} or float32 tensor of 1 to 4 dims", fix)
    _on_device("attn_bias", bias, q, fix)
    try:
        return torch.broadcast_to(bias.detach(), full)
    except RuntimeError:
        raise InvalidArgument("attn_bias", tuple(bias.shape), f"does not broadcast to {full}", fix) from None


def _variant_arguments(q, shapes, *, softcap, window, chunk, sinks, alibi_slopes=None, attn_bias=None) -> dict:
    """The variant keywords checked (an InvalidArgument names a bad one) and put as the kernels take them.

    softcap: None for no cap, math.inf too (it runs the very code of no cap). window: a side of -1, or one
    reaching past every key, becomes Nk on the left and Nq on the right, the least that reach every key
    (so the kernel's int32 sums cannot overflow); chunk: at most Nk, one chunk then holding every key.
    sinks: fp32 on q's device; alibi_slopes: fp32 (B, Hq); attn_bias: broadcast to (B, Hq, Nq, Nk).
    """
    checked = Variant(softcap=softcap, window=window, chunk=chunk)
    n_q, n_k = shapes.n_q, shapes.n_k
    out = dict(softcap=None if checked.softcap == math.inf else checked.softcap, window=None,
               chunk=None if checked.chunk is None else min(checked.chunk, n_k), sinks=_sinks(sinks, q, shapes.heads_q),
               alibi_slopes=_slopes(alibi_slopes, q, shapes), attn_bias=_attn_bias(attn_bias, q, shapes))
    if checked.window is not None:
        left, right = checked.window
        out["window"] = (n_k if left < 0 else min(left, n_k), n_q if right < 0 else min(right, n_q))
    return out


def triton_attention(
    q,
    k,
    v,
    *,
    scale,
    causal="none",
    attn_mask=None,
    softcap=None,
    window=None,
    chunk=None,
    sinks=None,
    alibi_slopes=None,
    attn_bias=None,
    alibi: str = "symmetric",
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int | None = None,
    input_precision: str = "tf32",
):
    """Flash-attention forward with Triton; returns ``(out, lse)``.

    ``q``: (B, Hq, Nq, D); ``k``, ``v``: (B, Hkv, Nk, D), (B, Hkv, Nk, Dv), one dtype (fp16, bf16 or
    fp32), any strides. ``out`` is (B, Hq, Nq, Dv) in q's dtype, ``lse`` (B, Hq, Nq) fp32 natural-log
    log-sum-exp. Rows with no visible key give ``out = 0`` and ``lse = -inf``.

    The variants of :mod:`flashcheck.features.variant`: ``softcap=c`` (``math.inf``: no cap),
    ``window=(left, right)`` (-1: unbounded), ``chunk=c`` and ``sinks``, a float32 tensor (Hq,) on q's
    device (then ``lse = sink`` on rows with no visible key), ``alibi_slopes`` ((Hq,) or (B, Hq), the bias
    ``alibi`` says: ``"symmetric"`` or ``"linear"``) and ``attn_bias`` (broadcastable to (B, Hq, Nq, Nk), in
    q's dtype or fp32; -inf hides a key), both added after the cap.

    ``block_m``/``block_n`` are the query/key tile sizes; ``num_warps``/``num_stages`` go to the GPU
    launch (None: Triton's default warps, and 3 stages or fewer when the K/V tiles of large head
    dims would not fit shared memory); ``input_precision="tf32"`` lets fp32 matmuls run as tf32 on the
    GPU, ``"ieee"`` keeps them fp32. CUDA tensors run compiled; CPU tensors need the Triton
    interpreter (``TRITON_INTERPRET=1`` set before triton is first used).
    """
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask
    )
    _check_options(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                   input_precision=input_precision, alibi=alibi)
    variant = _variant_arguments(q, shapes, softcap=softcap, window=window, chunk=chunk, sinks=sinks,
                                 alibi_slopes=alibi_slopes, attn_bias=attn_bias)
    _check_head_dim("q", q, shapes.head_dim, "head dim D", MIN_HEAD_DIM)
    # Dv only sizes the P @ V output; the padded V tile makes any Dv >= 1 work.
    _check_head_dim("v", v, shapes.head_dim_v, "value head dim Dv", 1)
    B, Hq, Nq, Nk = shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k
    if B * Hq > _MAX_GRID_Y:
        raise InvalidArgument("q", q, f"batch * heads = {B * Hq} exceeds the launch grid's {_MAX_GRID_Y}",
                              "Split the batch into several calls.")

    triton, kernel, interpreted = _load()
    if q.device.type != "cuda" and not interpreted:
        raise BackendUnavailable(
            BACKEND_NAME, str(q.device), "compiled Triton runs CUDA tensors only",
            "Pass CUDA tensors, or set TRITON_INTERPRET=1 before triton is first used to run on the "
            "CPU through the Triton interpreter.",
        )

    out = torch.empty((B, Hq, Nq, shapes.head_dim_v), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=torch.float32, device=q.device)
    if attn_mask is not None:
        # Broadcasting costs nothing: expanded dimensions get stride 0. uint8 is the same bytes as
        # bool with a pointer type every Triton version loads.
        mask = torch.broadcast_to(attn_mask, (B, Hq, Nq, Nk)).view(torch.uint8)
        mask_strides = mask.stride()
    else:
        mask, mask_strides = q, (0, 0, 0, 0)  # never read: HAS_MASK is False
    causal_offset = {"none": 0, "top_left": 0, "bottom_right": Nk - Nq}[causal]
    softcap, window, chunk, sinks = (variant[f] for f in ("softcap", "window", "chunk", "sinks"))
    slopes, bias = variant["alibi_slopes"], variant["attn_bias"]
    window_left, window_right = (0, 0) if window is None else window  # never read without a window

    block_d = _padded(shapes.head_dim)
    block_dv = _value_tile(shapes.head_dim_v, block_d)
    launch = {}
    if num_warps is not None:
        launch["num_warps"] = num_warps
    if num_stages is not None:
        launch["num_stages"] = num_stages
    elif q.device.type == "cuda" and not interpreted:
        launch["num_stages"] = _default_num_stages(q.device, block_m=block_m, block_n=block_n, block_d=block_d,
                                                   block_dv=block_dv, itemsize=q.element_size())
    grid = (triton.cdiv(Nq, block_m), B * Hq)
    zero = fp32_zero(q)
    kernel[grid](
        # Absent sinks and slopes read as one fp32 zero (so their pointers keep one type); q is never read as
        # the bias (HAS_BIAS is False then).
        q, k, v, out, lse, mask, zero if sinks is None else sinks, zero if slopes is None else slopes,
        q if bias is None else bias,
        *q.stride(), *k.stride(), *v.stride(), *out.stride(), *lse.stride(), *mask_strides,
        *(slopes.stride() if slopes is not None else (0, 0)), *(bias.stride() if bias is not None else (0, 0, 0, 0)),
        Hq, shapes.group, Nq, Nk, shapes.head_dim, shapes.head_dim_v,
        causal_offset, scale * _LOG2E,
        Nk - Nq, window_left, window_right, chunk or 1, 1.0 if softcap is None else softcap * _LOG2E,
        alibi_offset(alibi, Nq, Nk),
        *(int(t is not None) for t in (softcap, window, chunk, slopes, sinks)),
        IS_CAUSAL=causal != "none",
        HAS_MASK=attn_mask is not None,
        ALIBI_LINEAR=alibi == "linear",
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        BLOCK_DV=block_dv,
        INPUT_PRECISION=input_precision,
        **launch,
    )
    return out, lse


class _Differentiable(torch.autograd.Function):
    """The Triton forward, with the Triton backward of :mod:`flashcheck.kernels.triton.backward`."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, sinks, attn_bias, scale, causal, variant, options):
        out, lse = triton_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, sinks=sinks,
                                    attn_bias=attn_bias, **variant, **options)
        ctx.save_for_backward(q, k, v, out, lse, sinks, attn_bias)
        ctx.call = dict(attn_mask=attn_mask, scale=scale, causal=causal, variant=variant, options=options)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, sinks, attn_bias = ctx.saved_tensors
        call = ctx.call
        *_, attn_mask, shapes = check_attention_inputs(q, k, v, scale=call["scale"], causal=call["causal"],
                                                       attn_mask=call["attn_mask"])
        variant = _variant_arguments(q, shapes, sinks=None, attn_bias=attn_bias, **call["variant"])
        options = call["options"]
        block_d = _padded(shapes.head_dim)
        dq, dk, dv, dsinks, dbias = triton_attention_backward(
            q, k, v, out, lse, dout, scale=call["scale"], causal=call["causal"], attn_mask=attn_mask,
            softcap=variant["softcap"], window=variant["window"], chunk=variant["chunk"],
            sinks=sinks if ctx.needs_input_grad[4] else None, alibi_slopes=variant["alibi_slopes"],
            attn_bias=variant["attn_bias"], alibi=options["alibi"],
            bias_shape=attn_bias.shape if ctx.needs_input_grad[5] else None,
            shapes=shapes, block_m=options["block_m"], block_n=options["block_n"], block_d=block_d,
            block_dv=_value_tile(shapes.head_dim_v, block_d), input_precision=options["input_precision"])
        return dq, dk, dv, None, dsinks, dbias, None, None, None, None


def make_kernel(
    *,
    block_m: int = 64,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int | None = None,
    input_precision: str = "tf32",
    alibi: str = "symmetric",
) -> Kernel:
    """The Triton kernel with these options, as a :class:`flashcheck.contract.spec.Kernel` with its spec.

    Named ``flashcheck:triton[block_m=..,block_n=..]`` (other options appear when not the default).
    ``alibi``: the bias it makes of ``alibi_slopes``, ``"symmetric"`` or ``"linear"``.
    """
    _check_options(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                   input_precision=input_precision, alibi=alibi)

    forward_options = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                           input_precision=input_precision, alibi=alibi)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, softcap=None, window=None, chunk=None,
                  sinks=None, alibi_slopes=None, attn_bias=None):
        # The slopes get no gradient: autograd does not see them inside `variant`.
        variant = dict(softcap=softcap, window=window, chunk=chunk, alibi_slopes=alibi_slopes)
        if torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in (q, k, v, sinks, attn_bias)):
            return _Differentiable.apply(q, k, v, attn_mask, sinks, attn_bias, scale, causal, variant, forward_options)
        return triton_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, sinks=sinks,
                                attn_bias=attn_bias, **variant, **forward_options)

    options = [f"block_m={block_m}", f"block_n={block_n}"]
    if num_warps is not None:
        options.append(f"num_warps={num_warps}")
    if num_stages is not None:
        options.append(f"num_stages={num_stages}")
    if input_precision != "tf32":
        options.append(f"input_precision={input_precision}")
    if alibi != "symmetric":
        options.append(f"alibi={alibi}")
    spec = KernelSpec(
        dtypes=DTYPES,
        causal=CAUSAL_MODES,
        attn_mask=True,
        gqa=True,
        head_dims=None,
        min_head_dim=MIN_HEAD_DIM,
        max_head_dim=MAX_HEAD_DIM,
        dv_equals_d=False,
        fully_masked_rows="zero",
        precision="flash" if input_precision == "tf32" else "strict",
        deterministic=True,
        nan_safe_masking=True,
        backward=True,  # kernels/triton/backward.py: no atomics, a fixed order of sums
        deterministic_backward=True,
        softcap=True,
        alibi=alibi,
        attn_bias=True,
        fp32_bias=True,
        bias_order="cap_first",  # the kernel adds its biases after the cap
        window=True,
        chunk=True,
        sinks=True,
    )
    return Kernel(attention, spec, name=f"{BACKEND_NAME}[{','.join(options)}]")


def on_device(kernel: Kernel, device: str) -> Kernel:
    """``kernel`` (this one, or a planted-bug variant under its spec) with its spec on ``device``: that
    device alone, and its dtypes there (:func:`~.runtime.triton_dtypes`: none the Triton interpreter computes
    wrongly on the CPU). So a campaign does not draw bf16 there, and a judged bf16 case says nothing about it."""
    dtypes = triton_dtypes(device, kernel.spec.dtypes)
    return Kernel(kernel.fn, kernel.spec.replace(devices=(device,), dtypes=dtypes), name=kernel.name)
