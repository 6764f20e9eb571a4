"""NVFP4, emulated exactly: its quantizer's two scales and codes, and the 4-bit encoding of e2m1 codes.

A value is ``code * block_scale * global_scale``: an e2m1 code (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives), an
e4m3 scale per block of 16 values and one fp32 scale per tensor. The usual quantizer (NVIDIA's), in float64 here,
each rounding :func:`~.quantizers.round_to`'s (bit for bit torch's e4m3 cast, and the exact nearest e2m1):

- global scale: amax(tensor) / (6 * 448) rounded to fp32, so that a block scale of 448 reaches the tensor's largest
  value; 1 for an all-zero tensor, whose codes are all 0 whatever it is;
- block scale: amax(block) / 6 / global to the nearest e4m3, saturating at 448 (0 for an all-zero block);
- code: x / (block scale * global) to the nearest e2m1, ties to even, saturating at 6 (0 under a zero scale).

torch has the packed dtype ``float4_e2m1fn_x2`` but no cast to or from it: :func:`pack` writes each code's four
bits (sign, two exponent bits, one mantissa bit) two a byte, element 2i in the low nibble (c10's layout), and
:func:`unpack` reads them back.
"""

from __future__ import annotations

import functools

import torch

from ..contract.formats import format_of
from ..contract.quantization import CODE_CARRIER, CODES
from ..errors import InvalidArgument
from .quantizers import code_format, round_to, to_codes

__all__ = ["E2M1_MAX", "E2M1_VALUES", "global_scale", "block_scales", "codes", "encoded", "decoded", "pack", "unpack"]

E2M1_MAX = CODES["e2m1"][-1]
# The value of each 4-bit code: bit 3 the sign, bits 0 to 2 e2m1's eight magnitudes in order (-0.0 is code 8).
E2M1_VALUES = CODES["e2m1"] + tuple(-m for m in CODES["e2m1"])
_CARRIED = format_of(CODE_CARRIER).dtype  # the dtype cases carry the codes in


def global_scale(t: torch.Tensor, scale_format: str) -> torch.Tensor:
    """The fp32 global scale (0-dim, float64) of the tensor ``t`` whose block scales are of ``scale_format``."""
    amax = t.detach().double().abs().max()
    top = E2M1_MAX * code_format(scale_format).max_value
    return torch.where(amax > 0, (amax / top).float().double(), 1.0)


def block_scales(amax: torch.Tensor, global_: torch.Tensor, scale_format: str) -> torch.Tensor:
    """The block scales (float64, of ``scale_format``) of blocks whose largest magnitudes are ``amax``, under
    ``global_``."""
    return round_to(amax.double() / (E2M1_MAX * global_.double()), scale_format)


def codes(x: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The e2m1 codes (float64) of ``x`` under ``scales``: each value's block scale times the global (exact in
    float64), broadcastable to ``x``."""
    return to_codes(x, scales, "e2m1")


@functools.cache
def _code_of_byte(device) -> torch.Tensor:
    """The 4-bit code of each e4m3 byte that is an e2m1 value (16 for every other byte): the lookup that reads
    codes carried in e4m3, where each e2m1 value is exact."""
    table = torch.full((256,), 16, dtype=torch.uint8)
    table[torch.tensor(E2M1_VALUES).to(_CARRIED).view(torch.uint8).long()] = torch.arange(16).to(torch.uint8)
    return table.to(device)


def encoded(values: torch.Tensor) -> torch.Tensor:
    """The 4-bit codes (uint8, 0 to 15) of e2m1 values; any other value (NaN included: e2m1 has none) is refused."""
    carried = values.detach().to(_CARRIED)
    bits = _code_of_byte(carried.device)[carried.view(torch.uint8).long()]
    exact = values.dtype == _CARRIED or bool((carried.double() == values.detach().double()).all())
    if not exact or bool((bits == 16).any()):
        raise InvalidArgument("values", tuple(values.shape), "holds a value that is not an e2m1 code (NaN included)",
                              "Round them first: flashcheck.numerics.quantizers.round_to(x, 'e2m1').")
    return bits


def decoded(bits: torch.Tensor) -> torch.Tensor:
    """The float32 values of 4-bit codes (uint8, 0 to 15)."""
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=bits.device)[bits.long()]


def pack(values: torch.Tensor) -> torch.Tensor:
    """e2m1 values (..., D), D even, as ``float4_e2m1fn_x2`` (..., D / 2): two codes a byte, element 2i low."""
    if values.shape[-1] % 2:
        raise InvalidArgument("values", tuple(values.shape), "an odd last dim: two codes share a byte",
                              "Pass tensors whose last dim is even (pad with a zero code).")
    bits = encoded(values)
    return (bits[..., 0::2] | (bits[..., 1::2] << 4)).view(torch.float4_e2m1fn_x2)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The float32 values (..., 2 * n) of ``float4_e2m1fn_x2`` codes (..., n)."""
    bits = packed.view(torch.uint8)
    return decoded(torch.stack([bits & 15, bits >> 4], -1).flatten(-2))
