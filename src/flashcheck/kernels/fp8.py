"""``torch:fp8``: attention on fp8 inputs with FA3's descales, computed as FA3's fp8 path computes it.

q, k and v are fp8 (e4m3 or e5m2) with (B, Hkv) fp32 ``q_descale``, ``k_descale`` and ``v_descale``. The
scores are the fp8 products accumulated in fp32 (exact products), times ``scale * q_descale * k_descale``;
the softmax runs in fp32 and P is rounded to the inputs' fp8 format before P @ V, whose fp32 result is
divided by the row sum and multiplied by ``v_descale``; the output is bf16, the lse fp32 in natural log.
Its planted bugs (:mod:`flashcheck.kernels.planted`) are the descale defects users reported.
"""

from __future__ import annotations

import math

import torch

from ..contract import masks
from ..contract.formats import FORMATS, FP8_DTYPES, FP8_OUTPUT
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["FP8", "make_fp8_kernel"]

FP8 = "torch:fp8"


def _per_query_head(descale: torch.Tensor, heads_q: int) -> torch.Tensor:
    """(B, Hkv) descales as (B, Hq, 1, 1): the query heads of one K/V head share its descale."""
    return descale.repeat_interleave(heads_q // descale.shape[1], 1)[:, :, None, None]


def _fp8_attention(q, k, v, *, scale, causal, q_descale, k_descale, v_descale, mutant):
    B, Hq, Nq, _ = q.shape
    Nk, group = k.shape[2], Hq // k.shape[1]
    if mutant == "ignores_k_descale":
        k_descale = torch.ones_like(k_descale)
    keys, values = (t.float().repeat_interleave(group, 1) for t in (k, v))
    factor = (scale * _per_query_head(q_descale, Hq)) * _per_query_head(k_descale, Hq)
    s = (q.float() @ keys.transpose(-1, -2)) * factor
    visible = masks.visible(causal, None, (B, Hq, Nq, Nk)).to(q.device)
    s = s.masked_fill(~visible, -math.inf)
    # As a tiled kernel, which never loads them: keys no query sees add nothing (NaN there stays out).
    values = values.masked_fill(~visible.any(-2)[..., None], 0.0)
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    out = (p.to(q.dtype).float() @ values) / torch.where(total > 0, total, 1.0)
    vd = _per_query_head(v_descale, Hq)
    out = out * vd * (vd if mutant == "v_descale_twice" else 1.0)
    lse = torch.where(total > 0, m + torch.log(total), -math.inf)[..., 0]
    return out.masked_fill(total == 0, 0.0).to(FORMATS[FP8_OUTPUT].dtype), lse


def make_fp8_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """``torch:fp8`` on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(FP8, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, q_descale, k_descale, v_descale):
        return _fp8_attention(q, k, v, scale=scale, causal=causal, q_descale=q_descale, k_descale=k_descale,
                              v_descale=v_descale, mutant=mutant)

    spec = KernelSpec(dtypes=FP8_DTYPES, causal=("none", "top_left", "bottom_right"), gqa=True, dv_equals_d=False,
                      fully_masked_rows="zero", precision="flash", devices=(device,), nan_safe_masking=True,
                      # measured on the H200: cuBLAS picks other algorithms for other batch sizes
                      batch_invariant=device == "cpu")
    attention.__name__ = attention.__qualname__ = "fp8_attention"
    return Kernel(attention, spec, name=FP8 + (f"~{mutant}" if mutant else ""))
