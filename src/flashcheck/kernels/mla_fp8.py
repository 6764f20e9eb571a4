"""``torch:mla-fp8``: MLA decode on FlashMLA's fp8 latent cache (DeepSeek V3.2), the reference of the
``flashmla_fp8`` scheme (:data:`~flashcheck.contract.quantization.SCHEMES`).

FlashMLA's layout (``flash_mla_interface.py``, ``tests/quant.py``): each token's row is 656 bytes, the 512 latent
values as e4m3 codes, then 4 fp32 scales (scale i multiplies codes 128 i to 128 i + 127), then the 64 rope values in
bf16; the cache is (num_blocks, page_block_size, 1, 656) bytes and q stays bf16. Its SM90 decode forms each latent
value in bf16, the code times its scale rounded to bf16 (``sparse_fp8/splitkv_mla.cuh``), and uses the row both as
K and, its first 512 values, as V.

:func:`flash_mla_fp8` takes FlashMLA's call (q (B, Nq, Hq, 576), the packed cache, a block table and the cache
lengths) and unpacks the bytes as that decode does; the kernel flashcheck calls packs a case's row (its codes held in
bf16, :func:`pack_rows`) and its scales into those bytes, one page a sequence. The attention is
:func:`flashcheck.kernels.mla.attend`'s: two fp32 dots per logit, fp32 softmax, bf16 out. Its planted bugs
(:data:`flashcheck.kernels.planted.MLA_FP8`) misread the packed row.
"""

from __future__ import annotations

import torch

from ..contract.quantization import SCHEMES
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .mla import attend
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "SCHEME", "flash_mla_fp8", "make_mla_fp8_kernel", "pack_rows", "row_bytes", "unpack_rows"]

NAME = "torch:mla-fp8"
SCHEME = "flashmla_fp8"
BLOCK = SCHEMES[SCHEME].k.size  # codes per fp32 scale
_CODES, _ROPE = torch.float8_e4m3fn, torch.bfloat16
_EXPONENT_BITS = 0x7F800000  # an fp32's sign and significand cleared: its power of two (e8m0 rounding toward zero)


def row_bytes(rank: int, rope: int) -> int:
    """A token's bytes: ``rank`` codes, an fp32 scale per BLOCK of them, ``rope`` bf16 values (576 dims: 656)."""
    return rank + 4 * (rank // BLOCK) + 2 * rope


def pack_rows(kv: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """FlashMLA's packed rows (..., 656) of float8_e4m3fn bytes from a row (..., 576) whose latent holds e4m3 codes in
    bf16 and whose rope holds bf16 values, and its fp32 scales (..., 4)."""
    rank = scales.shape[-1] * BLOCK
    parts = (kv[..., :rank].to(_CODES).view(torch.uint8), scales.to(torch.float32).contiguous().view(torch.uint8),
             kv[..., rank:].to(_ROPE).contiguous().view(torch.uint8))
    return torch.cat(parts, -1).view(_CODES)


def _scales(raw: torch.Tensor, rank: int, mutant: str | None) -> torch.Tensor:
    """The fp32 scales of packed rows ``raw`` (..., bytes, uint8), as the decode reads them."""
    blocks = rank // BLOCK
    start = rank + (4 if mutant == "scale_of_next_block" else 0)
    scales = raw[..., start:start + 4 * blocks].contiguous().view(torch.float32)
    if mutant == "scales_through_e8m0":
        scales = (scales.view(torch.int32) & _EXPONENT_BITS).view(torch.float32)
    return scales


def unpack_rows(rows: torch.Tensor, rank: int, mutant: str | None = None) -> torch.Tensor:
    """Packed rows (..., bytes) as the bf16 rows (..., rank + rope) FlashMLA's SM90 decode forms: each code times its
    scale rounded to bf16, in bf16; the rope as stored."""
    raw, rope_at = rows.view(torch.uint8), rank + 4 * (rank // BLOCK)
    scales = _scales(raw, rank, mutant).to(_ROPE).repeat_interleave(BLOCK, -1)
    codes = raw[..., :rank].view(_CODES).to(_ROPE)
    latent = codes / scales if mutant == "scale_divides" else codes * scales
    rope = raw[..., rope_at:].contiguous().view(_ROPE)
    if mutant == "rope_read_as_codes":  # the rope's first bytes as codes of the last latent block's scale
        rope = raw[..., rope_at:rope_at + rope.shape[-1]].view(_CODES).to(_ROPE) * scales[..., -1:]
    return torch.cat((latent, rope), -1)


def flash_mla_fp8(q, k_cache, block_table, cache_seqlens, head_dim_v: int, *, softmax_scale: float, causal: bool,
                  mutant: str | None = None):
    """FlashMLA's ``flash_mla_with_kvcache(..., is_fp8_kvcache=True)`` in torch: q (B, Nq, Hq, D) bf16, k_cache
    (num_blocks, page_block_size, 1, bytes) of packed rows; returns out (B, Nq, Hq, head_dim_v) bf16 and lse (B, Hq,
    Nq) fp32, sequence by sequence (bottom-right causal)."""
    page = k_cache.shape[1]
    out = q.new_empty(*q.shape[:3], head_dim_v)
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
    for b, n in enumerate(cache_seqlens.tolist()):
        j = torch.arange(n, device=q.device)
        rows = unpack_rows(k_cache[block_table[b].long()[j // page], j % page], head_dim_v, mutant)  # (n, 1, D)
        o, lse[b] = attend(q[b].transpose(0, 1), rows.transpose(0, 1), rank=head_dim_v, scale=softmax_scale,
                           causal="bottom_right" if causal else "none", mutant=mutant)
        out[b] = o.transpose(0, 1).to(q.dtype)
    return out, lse


def make_mla_fp8_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """``torch:mla-fp8`` on ``device`` on the dense MLA form, with its planted bug ``mutant`` (a name the registry
    checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(NAME, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)

    def mla_fp8(q, kv, *, scale, causal="none", attn_mask=None, k_block_scales, v_block_scales):
        # v_block_scales are K's first (V is K's latent): FlashMLA's call has no place for them
        batch, n_k = kv.shape[0], kv.shape[2]
        cache = pack_rows(kv, k_block_scales).transpose(1, 2)  # (B, Nk, 1, bytes): one page a sequence
        table = torch.arange(batch, dtype=torch.int32, device=q.device)[:, None]
        lengths = torch.full((batch,), n_k, dtype=torch.int32, device=q.device)
        out, lse = flash_mla_fp8(q.transpose(1, 2), cache, table, lengths, k_block_scales.shape[-1] * BLOCK,
                                 softmax_scale=scale, causal=causal == "bottom_right", mutant=mutant)
        return out.transpose(1, 2), lse

    # sequence by sequence: a sequence's bits do not depend on its batch
    spec = KernelSpec(mla=True, dtypes=("bf16",), quantization=SCHEME, causal=("none", "bottom_right"),
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=True)
    return Kernel(mla_fp8, spec, name=f"{NAME}~{mutant}" if mutant else NAME)
