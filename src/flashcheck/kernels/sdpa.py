"""PyTorch's ``scaled_dot_product_attention`` with one backend forced, as flashcheck kernels.

``torch:math``, ``torch:flash``, ``torch:efficient`` and ``torch:cudnn`` call the public SDPA function
inside ``torch.nn.attention.sdpa_kernel(SDPBackend.X)``, so exactly one backend may run. Each gets
an honest :class:`~flashcheck.contract.spec.KernelSpec` for the device it was made for. What a spec cannot
express (cuDNN refusing Nk = 1, say) the forced backend refuses at call time: the adapter raises
:class:`~flashcheck.errors.Unsupported` with PyTorch's own reason, so the case is skipped, not failed.
:class:`BackendUnavailable` is kept for a backend that cannot run here at all (no CUDA, not built).

How the calling convention maps onto SDPA:

- ``causal="top_left"`` is ``is_causal=True``, and so is ``"bottom_right"`` when Nq == Nk (the two
  alignments coincide). Otherwise ``"bottom_right"`` is ``torch.nn.attention.bias.causal_lower_right``
  for CUDA's flash and efficient backends (their native bottom-right mode) and, for the others, the
  boolean mask PyTorch would build from it (importing that module costs ~1 s: it imports
  torch._dynamo and triton). With an ``attn_mask`` the causal mask is materialised and and-ed
  with it, since SDPA takes only one of the two.
- A boolean ``attn_mask`` is passed as is (True = attend, SDPA's convention), reshaped to 4-d
  because some backends take only 2-d or 4-d masks.
- ``attn_bias`` and ALiBi (where the spec declares them) go into a float ``attn_mask``, which SDPA adds
  to the scaled logits; the boolean mask and the causal alignment join it as -inf (see ``_float_mask``).
  Declared for math and CPU flash (fp32 masks with fp16/bf16 inputs accepted) and CUDA's efficient
  backend (the bias in the inputs' dtype only). Not declared for cuDNN: it took an fp32 mask with fp16
  inputs and returned NaN (torch 2.11, H200), though a mask in the inputs' dtype gave the right rows.
- GQA (Hq != Hkv) uses ``enable_gqa=True``; the memory-efficient backend refuses that, so its
  adapter repeats K and V over the query heads (an exact copy; the numerics are unchanged).
- The fused backends refuse tensors whose last dimension is not unit-stride; the adapter copies
  those (and only those) to a unit-stride layout, as any caller of SDPA would have to.

SDPA returns no log-sum-exp through its public API, so these adapters return ``out`` only.

Measured, fully masked rows (no visible key): math, CPU flash, CUDA flash and efficient give exactly
0 (CPU: torch 2.13; CUDA: torch 2.11 on an H200); cuDNN gives finite non-zero values (apparently the
mean of V over all keys), so its promise is ``"any"``. One PyTorch defect is left for flashcheck to
find rather than papered over: the efficient backend with ``causal_lower_right`` and Nq > Nk returns
wrong rows (errors of order 1) and non-zero empty rows (torch 2.11, H200).
"""

from __future__ import annotations

import contextlib
import math
import re
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..contract.formats import DTYPES
from ..contract.masks import causal as causal_mask_fn
from ..contract.masks import materialize
from ..contract.precision import Precision
from ..contract.spec import Kernel, KernelSpec
from ..contract.validation import CAUSAL_MODES
from ..errors import BackendUnavailable, InvalidArgument, Unsupported
from .adapters import validated_call

__all__ = ["SDPA_KERNELS", "make_sdpa_kernel", "fp32_matmul_mode", "NO_CUDA_REASON", "NO_CUDA_FIX"]

# name -> (SDPBackend member name, one-line description)
SDPA_KERNELS = {
    "torch:math": ("MATH", "PyTorch SDPA, math backend (upcasts fp16/bf16 to fp32, rounds once)"),
    "torch:flash": ("FLASH_ATTENTION", "PyTorch SDPA, FlashAttention backend (CUDA: FA2; CPU: PyTorch's tiled kernel)"),
    "torch:efficient": ("EFFICIENT_ATTENTION", "PyTorch SDPA, memory-efficient (xFormers/CUTLASS) backend, CUDA only"),
    "torch:cudnn": ("CUDNN_ATTENTION", "PyTorch SDPA, cuDNN attention backend, CUDA only"),
}

NO_CUDA_REASON = "no CUDA device is visible (torch.cuda.is_available() is False)"
NO_CUDA_FIX = "Run on a GPU machine or use --device cpu with torch:math or flashcheck:triton."

# The math backend computes in fp32 and rounds once, but its fp32 matmuls obey the global TF32
# switch, and so do the upcast copies of fp16/bf16 inputs: with TF32 on, Q*sqrt(scale), K*sqrt(scale)
# and P are all rounded to tf32 inside the matmuls, whatever the input dtype.
UPCAST_TF32 = Precision("upcast-tf32", tf32=True, p_dtype="fp32", rescales_per_tile=False, scale_on_inputs=True)

# The backends whose float attn_mask takes fp32 with fp16/bf16 inputs (torch 2.13, CPU): attn_bias and
# symmetric ALiBi go in one float mask (see _float_mask).
_FLOAT_MASK = dict(attn_bias=True, fp32_bias=True, alibi="symmetric")

_MULTIPLES_OF_8 = lambda top: tuple(range(8, top + 1, 8))  # noqa: E731


def fp32_matmul_mode(device_type: str) -> str:
    """How fp32 matmuls run on ``device_type`` right now: ``"ieee"``, ``"tf32"`` or ``"bf16"``.

    CUDA follows ``torch.backends.cuda.matmul.allow_tf32``; the CPU follows oneDNN's
    ``torch.backends.mkldnn.matmul.fp32_precision`` or, when that is unset, the global
    ``torch.get_float32_matmul_precision()`` ("high" allows tf32, "medium" bf16 where the CPU has it).
    """
    if device_type == "cuda":
        return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    mkl = getattr(getattr(torch.backends, "mkldnn", None), "matmul", None)
    setting = getattr(mkl, "fp32_precision", "none") if mkl is not None else "none"
    if setting in ("ieee", "tf32", "bf16"):
        return setting
    return {"highest": "ieee", "high": "tf32", "medium": "bf16"}.get(torch.get_float32_matmul_precision(), "ieee")


def _math_reduced_precision() -> bool:
    # torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) stops the math backend's upcast.
    getter = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return bool(getter()) if getter is not None else False


def _refuse_unfaithful_precision(name: str, device_type: str) -> str:
    """The fp32 matmul mode, or BackendUnavailable when no precision contract describes it."""
    mode = fp32_matmul_mode(device_type)
    if mode == "bf16":
        raise BackendUnavailable(
            name, device_type,
            "fp32 matmuls may run in bfloat16 here (torch.set_float32_matmul_precision('medium') or "
            "torch.backends.mkldnn.matmul.fp32_precision='bf16'); no flashcheck precision contract covers that",
            "Call torch.set_float32_matmul_precision('highest') (or 'high' for tf32) before resolving the kernel.",
        )
    if name == "torch:math" and _math_reduced_precision():
        raise BackendUnavailable(
            name, device_type,
            "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True) is set, so the math backend computes "
            "fp16/bf16 attention in the input dtype; no flashcheck precision contract covers that",
            "Call torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False) before resolving the kernel.",
        )
    return mode


def _spec(name: str, device_type: str, fp32_mode: str) -> KernelSpec:
    dev = (device_type,)
    if name == "torch:math":
        return KernelSpec(
            dtypes=DTYPES, causal=CAUSAL_MODES, attn_mask=True, gqa=True,
            dv_equals_d=False, fully_masked_rows="zero",
            precision=UPCAST_TF32 if fp32_mode == "tf32" else "upcast", devices=dev,
            nan_safe_masking=False,  # P @ V reads every key: 0 * NaN = NaN
            backward=True, **_FLOAT_MASK,
        )
    if name == "torch:flash" and device_type == "cpu":
        # PyTorch's own tiled CPU kernel takes everything the math backend does except Dv != D.
        return KernelSpec(
            dtypes=DTYPES, causal=CAUSAL_MODES, attn_mask=True, gqa=True,
            dv_equals_d=True, fully_masked_rows="zero", precision="flash", devices=dev,
            nan_safe_masking=False,  # P @ V reads every key: 0 * NaN = NaN
            backward=True, **_FLOAT_MASK,
            # Known defect (torch 2.13): NaN for a negative scale with causal masking.
            # tests/unit/test_sdpa_adapters.py keeps it visible.
            excludes=("negative_scale",),
            # Known backward defect (torch 2.13): with GQA the running sum of the query heads' dK and dV
            # shares is rounded to the dtype after each head (inf past 65,504 in fp16, though the summed
            # gradient is small). tests/unit/test_sdpa_adapters.py keeps it visible.
            backward_excludes=("group_share_past_range",),
        )
    if name == "torch:flash":
        # FA2: no fp32, no mask, D == Dv <= 256 (SDPA pads D to a multiple of 8). is_causal with
        # Nq != Nk is refused and no spec field says "top_left only when Nq == Nk"; where Nq == Nk
        # top_left is bottom_right, so declaring bottom_right alone loses nothing.
        return KernelSpec(
            dtypes=("fp16", "bf16"), causal=("none", "bottom_right"), attn_mask=False, gqa=True,
            min_head_dim=1, max_head_dim=256, dv_equals_d=True, fully_masked_rows="zero",
            precision="flash", devices=dev,
            nan_safe_masking=False,  # P @ V reads every key: 0 * NaN = NaN
            backward=True, deterministic_backward=False,  # dQ is summed with atomic adds
            # Known defect (torch 2.11, H200): NaN output for any negative scale (the row max is taken
            # before scaling). tests/gpu/test_sdpa_gpu.py keeps it visible.
            excludes=("negative_scale",),
            # Known backward defects (torch 2.11, H200): dS rounded to fp16 overflows (NaN gradients); with
            # GQA each query head's dK and dV is rounded to fp16 before the group is summed, so a share past
            # 65,504 is inf where the summed gradient is small. tests/gpu/test_sdpa_backward_defects_gpu.py
            # keeps both visible.
            backward_excludes=("ds_past_range", "group_share_past_range"),
        )
    if name == "torch:efficient":
        # D and Dv must be multiples of 8 (fp16/bf16; 4 for fp32), seen up to 512.
        return KernelSpec(
            dtypes=DTYPES, causal=CAUSAL_MODES, attn_mask=True, gqa=True,
            head_dims=_MULTIPLES_OF_8(512), max_head_dim=512, dv_equals_d=False,
            fully_masked_rows="zero", precision="flash", devices=dev,
            nan_safe_masking=False,  # P @ V reads every key: 0 * NaN = NaN
            backward=True, deterministic_backward=False,  # PyTorch documents its backward as nondeterministic
            # A float mask only in the inputs' dtype ("invalid dtype for bias - should match query's dtype"
            # for fp32 with fp16 inputs), so no ALiBi, which would be rounded to it (torch 2.11, H200).
            attn_bias=True,
            # Known defects (torch 2.11, H200): wrong rows with causal_lower_right when Nq > Nk, and wrong,
            # nondeterministic rows when K/V heads are stride-0 views. tests/gpu/test_sdpa_gpu.py keeps them.
            excludes=("bottom_right_more_queries", "stride0_heads"),
            # Known backward defects (torch 2.11, H200): scale x dS rounded to fp16 overflows (NaN
            # gradients) at large scales and falls among subnormals at tiny ones (dQ, dK over budget); with
            # GQA (K and V repeated over the group here, as a caller must) each head's dK and dV share is
            # fp16 before the group's sum. tests/gpu/test_sdpa_backward_defects_gpu.py keeps them visible.
            backward_excludes=("scaled_ds_past_range", "tiny_scale", "group_share_past_range"),
        )
    if name == "torch:cudnn":
        # fp16/bf16, D and Dv multiples of 8 up to 256; refuses Nk == 1 at call time.
        return KernelSpec(
            dtypes=("fp16", "bf16"), causal=CAUSAL_MODES, attn_mask=True, gqa=True,
            head_dims=_MULTIPLES_OF_8(256), max_head_dim=256, dv_equals_d=False,
            fully_masked_rows="any", precision="flash", devices=dev,
            nan_safe_masking=False,  # P @ V reads every key: 0 * NaN = NaN
            backward=True, deterministic_backward=False,  # not promised by cuDNN
            # Known backward defects (torch 2.11, cuDNN 9.19, H200): NaN gradients for a negative scale;
            # dQ, dK over budget at tiny scales; with GQA each query head's dK and dV share rounded to fp16
            # before the group's sum. tests/gpu/test_sdpa_backward_defects_gpu.py keeps them.
            backward_excludes=("negative_scale", "tiny_scale", "group_share_past_range"),
        )
    raise AssertionError(name)


def _check_available(name: str, device_type: str, backend) -> None:
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
        if name == "torch:flash":
            available = getattr(torch.backends.cuda, "is_flash_attention_available", lambda: True)
            if not available():
                raise BackendUnavailable(
                    name, "cuda", "this PyTorch build has no FlashAttention kernels "
                    "(torch.backends.cuda.is_flash_attention_available() is False)",
                    "Use torch:efficient or torch:math, or a PyTorch build with FlashAttention.",
                )
        if name == "torch:cudnn" and not torch.backends.cudnn.is_available():
            raise BackendUnavailable(name, "cuda", "cuDNN is not available to this PyTorch build",
                                     "Use torch:flash, torch:efficient or torch:math.")
    elif name in ("torch:efficient", "torch:cudnn"):
        raise BackendUnavailable(
            name, "cpu", "PyTorch has no CPU implementation of this SDPA backend "
            "(on the CPU only MATH and FLASH_ATTENTION exist)",
            "Run it with --device cuda on a GPU machine, or use torch:math or torch:flash on the CPU.",
        )
    if backend is None:
        raise BackendUnavailable(name, device_type, f"this PyTorch ({torch.__version__}) has no SDPBackend for it",
                                 "Upgrade PyTorch.")


_TRIGGERED = re.compile(r"\s*\(Triggered internally at .*\)\s*$", re.DOTALL)


def _refusal_reason(caught, exc: BaseException) -> str:
    """PyTorch's reasons for refusing an input: SDPA explains itself in warnings, not the error."""
    reasons = []
    for w in caught:
        text = _TRIGGERED.sub("", str(w.message)).strip()
        # Drop the header and the lines about the backends that sdpa_kernel switched off.
        if not text or "kernel not used because" in text or "has been runtime disabled" in text:
            continue
        if text not in reasons:
            reasons.append(text.rstrip("."))
    return "; ".join(reasons) if reasons else str(exc).strip().rstrip(".")


@contextlib.contextmanager
def _warn_every_time():
    """Some of SDPA's reasons are warned once per process (cuDNN's "does not support key/value sequence
    length 1", seen with torch 2.11): without this, a second refusal would give no reason at all."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(before)


def _unit_stride_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.size(-1) == 1 or t.stride(-1) == 1 else t.contiguous()


def _as_4d(mask: torch.Tensor) -> torch.Tensor:
    return mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)) if mask.dim() < 4 else mask


def _float_mask(bias, slopes, attn_mask, causal: str, shapes, dtype, device, *, fp32: bool) -> torch.Tensor:
    """SDPA's float attn_mask, added to the scaled logits: ``attn_bias`` plus symmetric ALiBi, -inf where the
    boolean mask or the causal alignment hides a key (SDPA takes one mask, and is_causal not with it).
    In fp32 where the backend takes an fp32 mask with half inputs (``fp32``), so that ALiBi is rounded once
    and the bias's gradient is summed over what the mask broadcasts along before its one rounding to the
    bias's dtype (a mask in the inputs' dtype rounds each element of dS first: measured, torch:math's fp16
    dbias NaN where the exact one is finite); else in the inputs' dtype, where adding 0 and -inf is exact."""
    Nq, Nk = shapes.n_q, shapes.n_k
    full = (shapes.batch, shapes.heads_q, Nq, Nk)
    wide = fp32 or slopes is not None or (bias is not None and bias.dtype == torch.float32)
    out = torch.zeros((), dtype=torch.float32 if wide else dtype, device=device)
    if slopes is not None:  # -slope |i + Nk - Nq - j|, flash-attention's
        i = torch.arange(Nq, device=device).view(-1, 1)
        distance = (i + (Nk - Nq) - torch.arange(Nk, device=device)).abs().float()
        slopes = slopes.to(device, torch.float32)
        out = -slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * distance
    if bias is not None:
        out = out + _as_4d(bias.to(device, out.dtype))  # out may be 0-d: it would not promote the sum
    visible = materialize(causal_mask_fn(causal, Nq, Nk), (1, 1, Nq, Nk), device=device)
    if attn_mask is not None:
        visible = visible & _as_4d(attn_mask)
    return torch.where(visible, out, torch.tensor(-math.inf, dtype=out.dtype, device=device)).expand(full)


def make_sdpa_kernel(name: str, *, device: str = "cuda") -> Kernel:
    """The SDPA backend ``name`` (a key of :data:`SDPA_KERNELS`) as a kernel for ``device``.

    ``device`` is ``"cuda"`` or ``"cpu"``. Raises :class:`BackendUnavailable` when the backend cannot
    run there (no CUDA, no CPU implementation, a precision setting no contract describes).
    """
    if name not in SDPA_KERNELS:
        raise InvalidArgument("name", name, "not a PyTorch SDPA kernel", f"Use one of {sorted(SDPA_KERNELS)}.")
    backend = getattr(SDPBackend, SDPA_KERNELS[name][0], None)
    _check_available(name, device, backend)
    fp32_mode = _refuse_unfaithful_precision(name, device)
    spec = _spec(name, device, fp32_mode)
    native_gqa = name != "torch:efficient"  # measured: efficient refuses enable_gqa
    fused = name != "torch:math"
    # Only CUDA's flash and efficient kernels have a bottom-right causal mode of their own, reached
    # through causal_lower_right; every other backend gets the boolean mask it would build from it.
    native_lower_right = device == "cuda" and name in ("torch:flash", "torch:efficient")

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, attn_bias=None, alibi_slopes=None):
        q, k, v, scale, causal, attn_mask, shapes = validated_call(
            name, device, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        # The declared precision read the TF32 switch when the kernel was made; refuse, rather than
        # be judged against a contract that no longer holds.
        if name == "torch:math" or (name == "torch:flash" and device == "cpu"):
            now = _refuse_unfaithful_precision(name, device)
            if now != fp32_mode:
                raise BackendUnavailable(
                    name, device, f"the fp32 matmul mode changed from {fp32_mode} to {now} after the kernel was "
                    "resolved, so its declared precision no longer holds",
                    "Resolve the kernel again after changing torch's TF32 / matmul precision settings.",
                )
        Nq, Nk = shapes.n_q, shapes.n_k
        if shapes.heads_q != shapes.heads_kv and not native_gqa:
            k = k.repeat_interleave(shapes.group, dim=1)
            v = v.repeat_interleave(shapes.group, dim=1)
        if fused:
            q, k, v = _unit_stride_last(q), _unit_stride_last(k), _unit_stride_last(v)

        # SDPA explains a refusal only in warnings; record them (and keep its chatter, such as
        # causal_lower_right's NaN warning for Nq > Nk, out of the user's output).
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kwargs = {"scale": scale}
            if shapes.heads_q != shapes.heads_kv and native_gqa:
                kwargs["enable_gqa"] = True
            if attn_bias is not None or alibi_slopes is not None:
                kwargs["attn_mask"] = _float_mask(attn_bias, alibi_slopes, attn_mask, causal, shapes, q.dtype, q.device,
                                                  fp32=spec.fp32_bias)
            elif attn_mask is not None:
                mask = _as_4d(attn_mask)
                if causal != "none":
                    mask = mask & materialize(causal_mask_fn(causal, Nq, Nk), (1, 1, Nq, Nk), device=q.device)
                kwargs["attn_mask"] = mask
            elif causal == "top_left" or (causal == "bottom_right" and Nq == Nk):
                kwargs["is_causal"] = True  # where Nq == Nk the two alignments coincide
            elif causal == "bottom_right" and native_lower_right:
                from torch.nn.attention.bias import causal_lower_right  # lazy: it imports torch._dynamo (~1 s)

                kwargs["attn_mask"] = causal_lower_right(Nq, Nk)
            elif causal == "bottom_right":  # the mask causal_lower_right materialises for these backends
                kwargs["attn_mask"] = torch.ones(Nq, Nk, dtype=torch.bool, device=q.device).tril(Nk - Nq)
            try:
                # Autograd only where the caller asks for gradients (the backward pass's check).
                wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
                with torch.set_grad_enabled(wants_grad), sdpa_kernel(backend), _warn_every_time():
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)
            except RuntimeError as exc:
                text = str(exc)
                if "No available kernel" in text or "No viable backend" in text:
                    raise Unsupported(_refusal_reason(caught, exc)) from exc
                raise

    attention.__name__ = attention.__qualname__ = name.split(":")[1]
    attention.__doc__ = f"{SDPA_KERNELS[name][1]}; forced with sdpa_kernel(SDPBackend.{SDPA_KERNELS[name][0]})."
    return Kernel(attention, spec, name=name)
