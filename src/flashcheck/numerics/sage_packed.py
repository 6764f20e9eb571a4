"""SageAttention 1.0.6's varlen quantizer (``sageattn_varlen``), emulated bit for bit on the packed batch.

q (total_q, Hq, D), k and v (total_k, Hkv, D), sequences one after another at their ``cu_seqlens``, as the package
takes them. Before its attention ``sageattn_varlen``

- casts v to fp16 (fp16, bf16 and fp32 inputs alike);
- smooths k (``smooth_k``, on by default) by its mean over dim 0: every packed token of every sequence together
  (the package's own comment: "km is calculated on all the batches"), in k's dtype, subtracted in place from the
  caller's k; so one sequence's keys move every other sequence's codes;
- quantizes (``quant_per_block_varlen.py``) each sequence's own blocks of tokens, 128 for q and 64 for k, counted
  from the sequence's first token, with the arithmetic of the dense quantizer (:func:`.sage.quantize_blocks`: the
  rows a sequence's last block lacks are masked loads, read as 0). Its scales lie (blocks, H, 1), sequence after
  sequence, from the offsets ``cu_seqlens_*_scale`` it returns; a sequence without tokens has no block.

Only the mean couples the sequences: once k is smoothed, sequence b's codes and scales are those the dense
quantizer gives it alone, which is how the oracle takes them (:mod:`flashcheck.inputs.serving_inside`).
tests/interpreter/test_sage_quantizer_varlen.py audits this module against the package's kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidArgument
from .sage import K_BLOCK, L2E, Q_BLOCK, quantize_blocks

__all__ = ["PACKED_HEAD_DIMS", "packed_mean", "PackedQuantized", "sage_quantize_packed"]

PACKED_HEAD_DIMS = (64, 128)  # sageattn_varlen asserts these (the dense call adds 96)
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def packed_mean(k: torch.Tensor) -> torch.Tensor:
    """k's mean over every packed token (dim 0), (1, Hkv, D) in k's dtype, as ``sageattn_varlen`` computes it: run
    it on the tensor the kernel receives, on its device, for the same bits (a reduction's order is torch's)."""
    return k.mean(dim=0, keepdim=True)


@dataclass(frozen=True)
class PackedQuantized:
    """What ``sageattn_varlen`` computes before its attention, in the package's layouts."""

    q_codes: torch.Tensor  # (total_q, Hq, D) int8
    q_scales: torch.Tensor  # (blocks of q, Hq) fp32: the package's (blocks, Hq, 1) without the 1
    k_codes: torch.Tensor  # (total_k, Hkv, D) int8
    k_scales: torch.Tensor  # (blocks of k, Hkv) fp32
    v: torch.Tensor  # (total_k, Hkv, Dv) fp16
    k_smoothed: torch.Tensor  # k as the quantizer receives it (k's dtype)


def _per_sequence(x: torch.Tensor, offsets: list[int], block: int, multiplier: float):
    """Codes (like x) and scales (blocks, H) of packed ``x``, each sequence quantized alone."""
    codes, scales = torch.empty(x.shape, dtype=torch.int8, device=x.device), []
    for start, stop in zip(offsets, offsets[1:]):
        if stop == start:
            continue
        c, s = quantize_blocks(x[start:stop].transpose(0, 1).unsqueeze(0), block, multiplier)
        codes[start:stop] = c[0].transpose(0, 1)
        scales.append(s[0].transpose(0, 1))
    empty = x.new_empty((0, x.shape[1]), dtype=torch.float32)
    return codes, torch.cat(scales) if scales else empty


def _check(q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.dtype not in _DTYPES or x.dtype != q.dtype:
            raise InvalidArgument(name, x, "not a 3-D tensor in q's dtype (fp16, bf16 or fp32)",
                                  "Pass q (total_q, Hq, D), k and v (total_k, Hkv, D) packed, one dtype.")
    if q.shape[-1] not in PACKED_HEAD_DIMS or k.shape[-1] != q.shape[-1]:
        raise InvalidArgument("k", k, f"head dims {q.shape[-1]} (q) and {k.shape[-1]} (k)",
                              f"SageAttention's packed call takes q and k of one head dim among {list(PACKED_HEAD_DIMS)}.")
    if len(cu_seqlens_q) != len(cu_seqlens_k) or int(cu_seqlens_q[-1]) != q.shape[0] \
            or int(cu_seqlens_k[-1]) != k.shape[0]:
        raise InvalidArgument("cu_seqlens_k", cu_seqlens_k, "offsets that do not end at the packed tensors' lengths",
                              "Pass (B + 1,) offsets from 0 to total_q (cu_seqlens_q) and total_k (cu_seqlens_k).")


def sage_quantize_packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q, cu_seqlens_k, *,
                         scale: float | None = None, smooth_k: bool = True) -> PackedQuantized:
    """SageAttention 1.0.6's varlen quantization of packed q, k, v, as ``sageattn_varlen`` does it before its
    attention (without touching the caller's k). ``scale``: the softmax scale, head dim ** -0.5 by default."""
    _check(q, k, v, cu_seqlens_q, cu_seqlens_k)
    sm_scale = q.shape[-1] ** -0.5 if scale is None else scale
    k = k - packed_mean(k) if smooth_k else k
    q_codes, q_scales = _per_sequence(q, [int(n) for n in cu_seqlens_q], Q_BLOCK, sm_scale * L2E)
    k_codes, k_scales = _per_sequence(k, [int(n) for n in cu_seqlens_k], K_BLOCK, 1.0)
    return PackedQuantized(q_codes, q_scales, k_codes, k_scales, v.to(torch.float16), k)
