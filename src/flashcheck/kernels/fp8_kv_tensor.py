"""``torch:fp8-kv-tensor``: an fp8 KV cache beside an unquantized q, in FlashInfer's convention (and vLLM's
``kv_cache_dtype`` "fp8", "fp8_e4m3" or "fp8_e5m2"), the reference of the ``per_tensor_kv`` scheme and, with the option
``codes=e5m2``, of ``per_tensor_kv_e5m2`` (:data:`~flashcheck.contract.quantization.SCHEMES`).

FlashInfer's prefill and decode wrappers take q in fp16 or bf16, k and v in e4m3 (or e5m2) and ``k_scale``,
``v_scale``, one fp32 each for the whole tensor. ``run`` folds ``k_scale`` into the softmax scale before the kernel
(``sm_scale *= k_scale``: one fp32 rounding) and multiplies the kernel's output, already rounded to q's dtype, by
``v_scale`` after it (``out *= v_scale``). Inside, the kernel casts each fp8 code to q's dtype (exact) before a
half-precision dot with fp32 sums, and rounds P to q's dtype for P @ V (``prefill.cuh``: ``vec_cast<DTypeQ,
DTypeKV>`` before ``mma_sync_m16n16k16_row_col_f16f16f32``). :func:`fp8_kv_attention` does the same in torch; the
kernel flashcheck calls casts the case's codes, held in q's dtype, to fp8 first. Its planted bugs
(:data:`flashcheck.kernels.planted.FP8_KV_TENSOR`) are those a port of that convention makes.
"""

from __future__ import annotations

import torch

from ..contract.formats import format_of
from ..contract.quantization import SCHEMES
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, InvalidArgument
from .fp8_blocks import masked_softmax_pv
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "SCHEMES_BY_CODES", "fp8_kv_attention", "make_fp8_kv_tensor_kernel"]

NAME = "torch:fp8-kv-tensor"
SCHEMES_BY_CODES = {"e4m3": "per_tensor_kv", "e5m2": "per_tensor_kv_e5m2"}  # the option codes=


def _fp8(scheme: str):
    return format_of(SCHEMES[scheme].held_codes).dtype


def _as_q_dtype(t8: torch.Tensor, dtype, heads: int, mutant: str | None) -> torch.Tensor:
    """An fp8 cache (B, Hkv, N, D) cast to q's dtype (exact), one copy per query head of its group."""
    if mutant == "codes_read_as_other_fp8":  # its bits read as the other fp8 format
        other = next(d for d in map(_fp8, SCHEMES_BY_CODES.values()) if d != t8.dtype)
        t8 = t8.view(other)
    return t8.to(dtype).repeat_interleave(heads // t8.shape[1], 1)


def fp8_kv_attention(q, k8, v8, *, sm_scale: float, k_scale: float, v_scale: float, causal: str = "none",
                     mutant: str | None = None):
    """FlashInfer's attention on an fp8 KV cache in torch: q (B, Hq, Nq, D) fp16 or bf16, k8 and v8 (B, Hkv, Nk, D)
    fp8; returns out (B, Hq, Nq, Dv) in q's dtype and lse (B, Hq, Nq) fp32."""
    dtype, Hq = q.dtype, q.shape[1]
    k, v = (_as_q_dtype(t, dtype, Hq, mutant) for t in (k8, v8))
    if mutant == "k_scale_twice":  # K dequantized as well as its scale folded into the softmax scale
        k = (k.float() * k_scale).to(dtype)
    folded = float(torch.tensor(sm_scale * k_scale, dtype=torch.float32))  # sm_scale *= k_scale, passed as fp32
    s = (q.float() @ k.float().transpose(-1, -2)) * folded  # products of half values are exact in fp32
    p_format = k8.dtype if mutant == "p_in_fp8" else dtype
    out, lse = masked_softmax_pv(s, v, causal, lambda p: p.to(p_format).float())
    out = out.to(dtype)
    if mutant != "v_scale_forgotten":  # out *= v_scale: a half tensor times an fp32 scalar, rounded again
        out = (out.float() * v_scale).to(dtype)
    return out, lse


def make_fp8_kv_tensor_kernel(*, device: str, mutant: str | None = None, codes: str = "e4m3") -> Kernel:
    """``torch:fp8-kv-tensor`` on ``device``, its cache in the fp8 format ``codes`` ("e4m3" or "e5m2"), with its
    planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(NAME, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if codes not in SCHEMES_BY_CODES:
        raise InvalidArgument("codes", codes, "unknown fp8 format of the KV cache", f"Use one of {list(SCHEMES_BY_CODES)}.")
    scheme = SCHEMES_BY_CODES[codes]
    cache = _fp8(scheme)

    def fp8_kv_tensor(q, k, v, *, scale, causal="none", attn_mask=None, k_scale, v_scale):
        # the case holds the codes in q's dtype; FlashInfer takes them as the fp8 cache
        return fp8_kv_attention(q, k.to(cache), v.to(cache), sm_scale=scale, k_scale=float(k_scale),
                                v_scale=float(v_scale), causal=causal, mutant=mutant)

    spec = KernelSpec(dtypes=("fp16", "bf16"), quantization=scheme, causal=("none", "top_left", "bottom_right"),
                      gqa=True, dv_equals_d=False, fully_masked_rows="zero", precision="flash", devices=(device,),
                      nan_safe_masking=True)
    # NAME~BUG[codes=...]: the form a saved case's kernel name resolves back from
    name = NAME + (f"~{mutant}" if mutant else "") + ("" if codes == "e4m3" else f"[codes={codes}]")
    return Kernel(fp8_kv_tensor, spec, name=name)
