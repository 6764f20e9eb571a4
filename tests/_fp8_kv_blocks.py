"""fp8 cases of the per_block_kv scheme (K and V with a scale per block of 16 keys) and their float64 attention,
for ``flashcheck:triton-fp8-kv-blocks``'s tests on the CPU and on a GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from flashcheck.contract.validation import Shapes
from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase

NAME = "flashcheck:triton-fp8-kv-blocks"
BLOCK = 16
SHAPES = Shapes(2, 4, 2, 37, 70, 64, 64)
ZERO_BLOCK = 1  # keys 16 to 31: all-zero codes, scale 0, in K and in V


@dataclass(frozen=True)
class KvBlocksCase:
    """fp8 q, k, v (B, H, N, D), descales (B, Hkv) and K's and V's block scales (B, Hkv, ceil(Nk / 16))."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    descales: tuple
    k_block_scales: torch.Tensor
    v_block_scales: torch.Tensor
    scale: float

    def kwargs(self, device="cpu") -> dict:
        return {**{n: d.to(device) for n, d in zip(("q_descale", "k_descale", "v_descale"), self.descales)},
                "k_block_scales": self.k_block_scales.to(device), "v_block_scales": self.v_block_scales.to(device)}

    def tensors(self, device="cpu") -> tuple:
        return tuple(t.to(device) for t in (self.q, self.k, self.v))

    def attention_case(self, causal: str) -> AttentionCase:
        variant = Variant(descales=torch.stack(self.descales), quantization="per_block_kv",
                          k_block_scales=self.k_block_scales, v_block_scales=self.v_block_scales)
        return AttentionCase.create(self.q, self.k, self.v, scale=self.scale, causal=causal, variant=variant)


def kv_blocks_case(shapes: Shapes = SHAPES, dtype=torch.float8_e4m3fn, seed: int = 0) -> KvBlocksCase:
    """Random codes, q's descale random, k's and v's powers of two, block scales random in [1/4, 4) (K's last block
    3, far from 1) and block ``ZERO_BLOCK`` all zero in K and V, codes and scale."""
    g = torch.Generator().manual_seed(seed)
    B, Hq, Hkv, Nq, Nk, D, Dv = (shapes.batch, shapes.heads_q, shapes.heads_kv, shapes.n_q, shapes.n_k, shapes.head_dim,
                                 shapes.head_dim_v)
    q, k, v = ((torch.randn(B, h, n, d, generator=g) * 3).to(dtype)
               for h, n, d in ((Hq, Nq, D), (Hkv, Nk, D), (Hkv, Nk, Dv)))
    blocks = -(-Nk // BLOCK)
    k_scales, v_scales = (torch.exp2(torch.rand(B, Hkv, blocks, generator=g) * 4 - 2) for _ in "kv")
    k_scales[:, :, -1] = 3.0
    if blocks > ZERO_BLOCK + 1:
        for codes, scales in ((k, k_scales), (v, v_scales)):
            codes[:, :, ZERO_BLOCK * BLOCK:(ZERO_BLOCK + 1) * BLOCK] = 0
            scales[:, :, ZERO_BLOCK] = 0.0
    q_descale = 0.1 + 0.3 * torch.rand(B, Hkv, generator=g)
    k_descale, v_descale = (torch.exp2(torch.randint(-1, 2, (B, Hkv), generator=g).float()) for _ in "kv")
    return KvBlocksCase(q, k, v, (q_descale, k_descale, v_descale), k_scales, v_scales, D ** -0.5)


def reference(case: KvBlocksCase, causal: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) in float64: the codes times their block scales and descales, then softmax attention."""
    q, k, v = (t.double() for t in (case.q, case.k, case.v))
    Hq, Hkv, Nq, Nk = q.shape[1], k.shape[1], q.shape[2], k.shape[2]
    descales = [d.double()[:, :, None, None] for d in case.descales]
    k = k * case.k_block_scales.double().repeat_interleave(BLOCK, 2)[:, :, :Nk, None] * descales[1]
    v = v * case.v_block_scales.double().repeat_interleave(BLOCK, 2)[:, :, :Nk, None] * descales[2]
    group = Hq // Hkv
    q = q * descales[0].repeat_interleave(group, 1)
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * case.scale
    i, j = torch.arange(Nq)[:, None], torch.arange(Nk)[None, :]
    if causal != "none":
        s = s.masked_fill(j > i + (Nk - Nq if causal == "bottom_right" else 0), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def errors(kernel, case: KvBlocksCase, causal: str, device="cpu") -> tuple[float, float, float, bool]:
    """(max |out - ref|, max |ref|, max |lse - ref lse|, whether out holds a NaN) of ``kernel`` on ``case``."""
    q, k, v = case.tensors(device)
    out, lse = kernel(q, k, v, scale=case.scale, causal=causal, **case.kwargs(device))
    ref, ref_lse = reference(case, causal)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32 and out.shape == ref.shape
    out, lse = out.cpu().double(), lse.cpu().double()
    return (float((out - ref).abs().max()), float(ref.abs().max()), float((lse - ref_lse).abs().max()),
            bool(out.isnan().any()))


def within_tolerance(err: float, largest: float) -> bool:
    return err <= 0.02 * largest + 1e-3
