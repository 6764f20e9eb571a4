"""``torch:int8-qk``: the reference of the ``sage_int8`` scheme, a kernel that quantizes inside
(:data:`~flashcheck.contract.quantization.SCHEMES`), written as such kernels compute: q, k and v quantized as the
scheme declares (SageAttention 1.0.6's quantizer: :func:`flashcheck.numerics.sage.sage_quantize`), the scores as the
exact integer dot of the codes times q's and k's fp32 block scales, in log2 units, every key past the keys masked
with -inf, P rounded to fp16, P @ V in fp32 (the scheme allows fp16 sums per 64 keys), the output in the input
dtype.

Its planted bugs (:data:`PLANTED`) are the defects a port of that scheme makes, SageAttention's own first.
"""

from __future__ import annotations

import math
import torch

from ..contract import masks
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from ..numerics.sage import HEAD_DIMS, K_BLOCK, Q_BLOCK, sage_quantize
from .planted import INT8_QK as PLANTED
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "PLANTED", "make_int8_qk_kernel"]

NAME = "torch:int8-qk"


def _per_token(scales: torch.Tensor, block: int, n: int, mutant: str | None) -> torch.Tensor:
    """One fp32 scale per token (B, H, N, 1); planted, every block takes the first block's."""
    if mutant == "first_block_scale_everywhere":
        scales = scales[:, :, :1].expand_as(scales)
    return scales.float().repeat_interleave(block, 2)[:, :, :n, None]


def _scores(quantized, heads: int, mutant: str | None) -> torch.Tensor:
    """The logits in log2 units: the integer dot (exact in float64: |S| < 2^24) times q's and k's scales in fp32."""
    group = heads // quantized.k_codes.shape[1]
    k_codes = quantized.k_codes.repeat_interleave(group, 1)
    dot = (quantized.q_codes.double() @ k_codes.double().transpose(-1, -2)).float()
    n_q, n_k = quantized.q_codes.shape[2], k_codes.shape[2]
    q_scale = _per_token(quantized.q_scales, Q_BLOCK, n_q, mutant)
    k_scale = _per_token(quantized.k_scales, K_BLOCK, n_k, None).repeat_interleave(group, 1)
    s = dot * q_scale * k_scale.transpose(-1, -2)
    return s.half().float() if mutant == "scores_in_fp16" else s


def _attention(q, k, v, *, scale, causal, mutant: str | None):
    quantized = sage_quantize(q, k, v, scale=scale)
    B, Hq, Nq, _ = q.shape
    n_k = k.shape[2]
    s = _scores(quantized, Hq, mutant)
    visible = masks.visible(causal, None, (B, Hq, Nq, n_k)).to(q.device)
    s = s.masked_fill(~visible, -math.inf)
    v16 = quantized.v.repeat_interleave(Hq // v.shape[1], 1).float()
    if mutant == "padded_keys_unmasked":  # SageAttention 1.0.6 without the causal mask: score 0 on the padding
        pad = -n_k % K_BLOCK
        s = torch.nn.functional.pad(s, (0, pad)) if causal == "none" else s
        v16 = torch.nn.functional.pad(v16, (0, 0, 0, s.shape[-1] - n_k))
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp2(s - m)
    total = p.sum(-1, keepdim=True)
    out = (p.half().float() @ v16) / torch.where(total > 0, total, 1.0)
    return out.masked_fill(total == 0, 0.0).to(q.dtype)


def make_int8_qk_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """``torch:int8-qk`` on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(NAME, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None):
        return _attention(q, k, v, scale=scale, causal=causal, mutant=mutant)

    spec = KernelSpec(dtypes=("fp16", "bf16", "fp32"), causal=("none", "top_left", "bottom_right"), gqa=True,
                      head_dims=HEAD_DIMS, fully_masked_rows="zero", precision="flash", devices=(device,),
                      nan_safe_masking=True, quantization="sage_int8")
    attention.__name__ = attention.__qualname__ = "int8_qk_attention"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))

