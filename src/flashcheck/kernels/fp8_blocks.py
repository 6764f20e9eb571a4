"""Block-scaled fp8 attention in torch: the references of the quantization schemes with block scales.

- ``torch:fp8-kv-token`` and ``torch:fp8-kv-blocks``: an fp8 KV cache with an fp32 scale per token (vLLM's
  per-token-head scales) or per block of 16 tokens (a page's), computed as such caches' kernels compute: q, k
  and v dequantized in fp32 (codes times block scale times descale) and rounded to bf16, the scores in fp32,
  P rounded to bf16 for P @ V, the output bf16.
- ``torch:mxfp8``: MXFP8, e4m3 codes with an e8m0 scale per 32 values along each product's contracted axis
  (q and k along the head dims, v along the tokens): the products of codes and power-of-two scales exact in
  fp32, P requantized to e4m3 with an e8m0 scale per 32 keys, the least power of two that keeps the block's
  largest P within 448 (NVIDIA's rounding up of the OCP scale).
- ``torch:nvfp4``: NVFP4, e2m1 codes (carried in e4m3, read packed two a byte as a kernel reads them) with an e4m3
  scale per 16 values along each product's contracted axis and an fp32 global scale per tensor: codes times block
  scale (exact in fp32) times the global scale, rounded to bf16, the scores in fp32, P in bf16 for P @ V.

Their planted bugs (:data:`PLANTED`) are the block-scale defects users reported or that a port makes.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ..contract import masks
from ..contract.quantization import Blocks, scheme_named
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from ..features.quantized import expanded
from ..numerics import nvfp4
from ..numerics.quantizers import pow2_scale
from .planted import KV_BLOCK_SCALES, MXFP8 as PLANTED_MXFP8, NVFP4 as PLANTED_NVFP4
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["KV_TOKEN", "KV_BLOCKS", "MXFP8", "NVFP4", "PLANTED", "make_block_scaled_kernel", "masked_softmax_pv"]

KV_TOKEN, KV_BLOCKS, MXFP8, NVFP4 = "torch:fp8-kv-token", "torch:fp8-kv-blocks", "torch:mxfp8", "torch:nvfp4"
_SCHEMES = {KV_TOKEN: "per_token_kv", KV_BLOCKS: "per_block_kv", MXFP8: "mxfp8", NVFP4: "nvfp4"}
PLANTED = {KV_TOKEN: KV_BLOCK_SCALES[:1], KV_BLOCKS: KV_BLOCK_SCALES, MXFP8: PLANTED_MXFP8, NVFP4: PLANTED_NVFP4}
# the tensor each bug misreads
_TENSOR_OF = {"scale_of_next_block_at_edge": "k", "zero_scale_divides": "v", "e4m3_read_as_e8m0": "k",
              "global_scale_forgotten": "k", "dim_scale_of_next_block_at_edge": "k"}
_P_FORMAT = torch.float8_e4m3fn
_P_MAX = 448.0
_P_BLOCK = 32


def _per_query_head(descale: torch.Tensor, heads: int) -> torch.Tensor:
    return descale.float().repeat_interleave(heads // descale.shape[1], 1)[:, :, None, None]


def _block_index_slip(scales: torch.Tensor, blocks: Blocks, shape) -> torch.Tensor:
    """Per-value scales, broadcastable to ``shape`` (B, H, N, D), read at block (i + 1) // size along the blocks'
    axis, clamped to the last block."""
    n = shape[3] if blocks.axis == "dims" else shape[2]
    index = ((torch.arange(n, device=scales.device) + 1) // blocks.size).clamp(max=blocks.count(n) - 1)
    if blocks.axis == "dims":
        return scales.float()[..., index]
    picked = scales.float()[:, :, index]
    return picked[..., None] if blocks.axis == "tokens" else picked


def _kv_values(t8, descale, block_scales, blocks: Blocks, heads: int, mutant: str | None):
    """A KV cache's tensor dequantized in fp32 and rounded to bf16."""
    per_key = expanded(block_scales.float(), blocks, t8.shape)
    if mutant == "scale_of_next_block_at_edge":
        per_key = _block_index_slip(block_scales, blocks, t8.shape)
    values = t8.float() * per_key
    if mutant == "zero_scale_divides":
        largest = expanded(block_scales.float(), blocks, t8.shape)  # this cache's blocks hold one scale each
        values = t8.float() * (per_key / largest) * largest
    return (values * _per_query_head(descale, t8.shape[1])).to(torch.bfloat16).repeat_interleave(heads // t8.shape[1], 1)


def _mx_values(t8, block_scales, blocks: Blocks, heads: int, mutant: str | None):
    scales = block_scales
    if mutant == "e8m0_read_as_e4m3":
        scales = scales.view(torch.uint8).view(_P_FORMAT)
    values = t8.float() * expanded(scales.float(), blocks, t8.shape)
    return values.repeat_interleave(heads // t8.shape[1], 1)


def _nvfp4_values(t8, block_scales, global_scale, blocks: Blocks, heads: int, mutant: str | None):
    """An NVFP4 tensor as a kernel dequantizes it: its codes read packed, times their block scales (exact in fp32),
    times the global scale, rounded to bf16."""
    codes = nvfp4.unpack(nvfp4.pack(t8))
    scales = block_scales
    if mutant == "e4m3_read_as_e8m0":
        scales = scales.view(torch.uint8).view(torch.float8_e8m0fnu)
    per_value = (_block_index_slip(scales, blocks, t8.shape) if mutant == "dim_scale_of_next_block_at_edge"
                 else expanded(scales.float(), blocks, t8.shape))
    if mutant == "zero_scale_divides":  # brought to the block's scale and back: 0 / 0 on an all-zero block
        per_value = per_value / per_value * per_value
    values = codes * per_value * (1.0 if mutant == "global_scale_forgotten" else global_scale.float())
    return values.to(torch.bfloat16).repeat_interleave(heads // t8.shape[1], 1)


def _requantized_p(p: torch.Tensor, mutant: str | None) -> torch.Tensor:
    """P (B, H, Nq, Nk) in e4m3 with an e8m0 scale per 32 keys, as the values the codes stand for."""
    nk = p.shape[-1]
    pad = -nk % _P_BLOCK
    blocks = torch.nn.functional.pad(p, (0, pad)).unflatten(-1, (-1, _P_BLOCK))
    amax = blocks.abs().amax(-1, keepdim=True).double()
    rule = "ocp" if mutant == "p_sum_unclamped" else "ceil"
    scale = torch.where(amax > 0, pow2_scale(amax, _P_MAX, rule=rule), 1.0).float()
    codes = (blocks / scale).clamp(-_P_MAX, _P_MAX).to(_P_FORMAT)
    return (codes.float() * scale).flatten(-2)[..., :nk]


def _attention(q, k, v, *, scale, causal, kwargs, name: str, mutant: str | None):
    scheme = scheme_named(_SCHEMES[name])
    Hq = q.shape[1]
    if name == MXFP8:
        qv, kv, vv = (_mx_values(t, kwargs[f"{n}_block_scales"], b, Hq, mutant if n == "k" else None)
                      for t, n, b in zip((q, k, v), "qkv", scheme.blocks))
    elif name == NVFP4:
        qv, kv, vv = (_nvfp4_values(t, kwargs[f"{n}_block_scales"], kwargs[f"{n}_global_scale"], b, Hq,
                                    mutant if n == _TENSOR_OF.get(mutant) else None)
                      for t, n, b in zip((q, k, v), "qkv", scheme.blocks))
    else:
        qv = (q.float() * _per_query_head(kwargs["q_descale"], Hq)).to(torch.bfloat16)
        kv, vv = (_kv_values(t, kwargs[f"{n}_descale"], kwargs[f"{n}_block_scales"], b, Hq,
                             mutant if n == _TENSOR_OF.get(mutant) else None)
                  for t, n, b in zip((k, v), "kv", scheme.blocks[1:]))
    s = (qv.float() @ kv.float().transpose(-1, -2)) * scale
    rounding = partial(_requantized_p, mutant=mutant) if name == MXFP8 else (lambda p: p.to(torch.bfloat16).float())
    out, lse = masked_softmax_pv(s, vv, causal, rounding)
    return out.to(torch.bfloat16), lse


def masked_softmax_pv(s, v, causal: str, rounding):
    """(out fp32, lse) of fp32 scores ``s`` (B, Hq, Nq, Nk) and values ``v`` (B, Hq, Nk, Dv) under the mask
    ``causal``, P rounded by ``rounding`` for P @ V; a row with no visible key is 0 (lse -inf)."""
    visible = masks.visible(causal, None, s.shape).to(s.device)
    s = s.masked_fill(~visible, -math.inf)
    v = v.float().masked_fill(~visible.any(-2)[..., None], 0.0)  # keys no query sees are never loaded
    m = s.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(s - m)
    total = p.sum(-1, keepdim=True)
    out = (rounding(p) @ v) / torch.where(total > 0, total, 1.0)
    lse = torch.where(total > 0, m + torch.log(total), -math.inf)[..., 0]
    return out.masked_fill(total == 0, 0.0), lse


def make_block_scaled_kernel(name: str, *, device: str, mutant: str | None = None) -> Kernel:
    """The reference ``name`` on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, **scales):
        return _attention(q, k, v, scale=scale, causal=causal, kwargs=scales, name=name, mutant=mutant)

    spec = KernelSpec(dtypes=("fp8_e4m3",) if name in (MXFP8, NVFP4) else ("fp8_e4m3", "fp8_e5m2"),
                      # NVFP4's codes are read packed two a byte along the head dims
                      head_dims=tuple(range(2, 257, 2)) if name == NVFP4 else None,
                      causal=("none", "top_left", "bottom_right"), gqa=True, dv_equals_d=False,
                      fully_masked_rows="zero", precision="flash", devices=(device,), nan_safe_masking=True,
                      # no batch invariance: sums of bf16 products in fp32 follow the BLAS's order, which the batch
                      # size picks (a campaign on the CPU found one)
                      quantization=_SCHEMES[name])
    attention.__name__ = attention.__qualname__ = "block_scaled_attention"
    return Kernel(attention, spec, name=name + (f"~{mutant}" if mutant else ""))


MAKERS = {name: partial(make_block_scaled_kernel, name) for name in _SCHEMES}
