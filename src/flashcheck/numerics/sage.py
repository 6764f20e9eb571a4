"""SageAttention 1.0.6's quantizer, emulated bit for bit: the int8 codes and fp32 scales its kernel computes
from fp16, bf16 or fp32 Q and K, the smoothing of K before it and the fp16 cast of V.

Per batch entry, head and block of tokens (128 for Q, 64 for K) times all head dims, in float32
(``quant_per_block.py``; the ``_hd96`` kernel pads D = 96 to 128 with zeros, which change no max):

    a     = RN(f32(x) * m)      m = RN_f32(sm_scale * 1.44269504) for Q (the package's literal), 1 for K
    scale = max |a| / 127       NaN-ignoring max; rows past N are masked loads, read as 0
    y     = a / scale
    code  = int8(trunc(RN(y + s)))   s = 0.5 where y >= 0 (-0.0 included), else -0.5 (NaN included)

So codes round half away from zero, through a float32 add: the largest float32 under 0.5, 0.49999997, sums to
1.0 and gives 1. An all-zero block gets scale 0 and codes 0 (0 / 0 is NaN, cast to 0); a NaN counts for no
max and gets code 0; an infinity makes the scale infinite and every code of its block 0. A scale under
float32's normal range (fp32 or bf16 inputs of magnitude under ~1e-36) is inexact enough that y passes 127.5:
the interpreter's numpy cast then goes through int32 and keeps the low byte (x86: 180.5 gives -76, and
anything past int32's range, infinities included, 0); compiled code saturates to int16 first (``cvt.rzi.s16``).

The exact reference is the Triton interpreter, whose divisions are IEEE (tests/interpreter/
test_sage_quantizer.py audits this module against the package's own kernels there). Compiled GPU code divides
approximately (``div.full.f32``, within 2 ulp; Triton 3.9 also forms the scale as ``amax * approx(1/127)``), so
its scales may differ in the last bits and a code by one where y lies near a half-integer: :func:`ambiguous`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidArgument

__all__ = ["L2E", "Q_BLOCK", "K_BLOCK", "HEAD_DIMS", "AMBIGUITY_ULPS", "smooth_k", "quantize_blocks",
           "near_half", "ambiguous", "SageQuantized", "Dequantized", "sage_quantize"]

L2E = 1.44269504  # the literal SageAttention folds into Q (log2 e is 1.4426950408889634...)
Q_BLOCK, K_BLOCK = 128, 64
HEAD_DIMS = (64, 96, 128)
# A GPU's y is within ~2 ulp of the IEEE quotient, and its scale a few ulp off IEEE's: a code can move only where
# y is this many float32 ulps of y (or fewer) from a half-integer. Measured on an H100 under Triton 3.6 (60 calls,
# 19.85M codes): 636 codes one apart from this emulation (3.2e-5) and 134 of 2,700 scales one ulp apart.
AMBIGUITY_ULPS = 8
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_SEQ = 2  # layout (B, H, N, D): SageAttention's "HND"


def _check_tensor(x: object, argument: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 4 or x.dtype not in _DTYPES:
        raise InvalidArgument(argument, x, "not a 4-D fp16, bf16 or fp32 tensor",
                              "Pass it laid out (batch, heads, tokens, head dim), as SageAttention's 'HND'.")
    return x


def smooth_k(k: torch.Tensor) -> torch.Tensor:
    """K less its mean over the tokens, per batch entry, head and dim, as SageAttention's ``sageattn`` computes
    it: the mean in K's dtype (torch accumulates fp16 and bf16 in fp32 and rounds once), then one subtraction
    rounded to K's dtype. The package subtracts in place, on the caller's tensor; this returns a new one."""
    k = _check_tensor(k, "k")
    return k - k.mean(dim=_SEQ, keepdim=True)


def _fp32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A Python float as the kernel receives a float argument: rounded once to float32 (ties to even)."""
    return torch.tensor(value, dtype=torch.float32, device=like.device)


def _quotients(x: torch.Tensor, block: int, multiplier: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 quotients y, shaped like x, and the scales (B, H, ceil(N / block))."""
    b, h, n, d = x.shape
    blocks = -(-n // block)
    a = x.to(torch.float32) * _fp32(multiplier, x)
    a = torch.nn.functional.pad(a, (0, 0, 0, blocks * block - n)).reshape(b, h, blocks, block * d)
    nan = torch.isnan(a)
    amax = torch.where(nan, 0.0, a.abs()).amax(-1)
    amax = torch.where(nan.all(-1), math.nan, amax)  # the kernel's maxnum is NaN only if every value is
    # a full divisor: torch may turn a division by a scalar into a multiplication by its reciprocal
    scale = amax / torch.full_like(amax, 127.0)
    y = a / scale[..., None]
    return y.reshape(b, h, blocks * block, d)[:, :, :n], scale


def _codes(y: torch.Tensor) -> torch.Tensor:
    """int8(trunc(RN_f32(y +- 0.5))), cast as numpy casts float32 to int8 on x86: through int32, keeping the
    low byte, with NaN and anything past int32's range giving 0."""
    t = torch.trunc(y + torch.where(y >= 0, 0.5, -0.5).to(torch.float32))  # NaN >= 0 is False: -0.5
    fits = t.abs() < 2.0**31
    low = torch.remainder(torch.where(fits, t, 0.0).to(torch.int64) + 128, 256) - 128
    return low.to(torch.int8)


def quantize_blocks(x: torch.Tensor, block: int, multiplier: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SageAttention's codes (int8, shaped like x) and scales (fp32, (B, H, ceil(N / block))) of ``x`` laid
    out (B, H, N, D), one scale per ``block`` tokens of each batch entry and head, after multiplying x by
    ``multiplier`` rounded to float32. Q: block 128, multiplier sm_scale * L2E; K: block 64, multiplier 1."""
    x = _check_tensor(x, "x")
    y, scale = _quotients(x, block, multiplier)
    return _codes(y), scale


def near_half(y: torch.Tensor, ulps: int = AMBIGUITY_ULPS) -> torch.Tensor:
    """Where float32 ``y`` is at most ``ulps`` ulps of y (the spacing above |y|) from a half-integer: there an
    approximate division may move the code by one. Exact: y, its ulp and the distance are float64 values."""
    magnitude = y.abs()
    ulp = (torch.nextafter(magnitude, torch.full_like(magnitude, math.inf)) - magnitude).to(torch.float64)
    y = y.to(torch.float64)
    return (y - (torch.floor(y) + 0.5)).abs() <= ulps * ulp  # NaN and infinities: False


def ambiguous(x: torch.Tensor, block: int, multiplier: float, ulps: int = AMBIGUITY_ULPS) -> torch.Tensor:
    """The codes of :func:`quantize_blocks` (same arguments) that compiled GPU code may give one apart."""
    x = _check_tensor(x, "x")
    return near_half(_quotients(x, block, multiplier)[0], ulps)


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    per_token = scales.to(torch.float64).repeat_interleave(block, dim=2)[:, :, :codes.shape[2], None]
    return codes.to(torch.float64) * per_token  # exact: 8 bits times 24


@dataclass(frozen=True)
class Dequantized:
    """The values SageAttention's kernel attends, in float64. ``q`` carries sm_scale * L2E (rounded to fp32):
    q . k is the score in log2 units, as the kernel feeds it to exp2. A code of an infinite-scale block gives
    NaN, as the kernel's 0 * inf does."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


@dataclass(frozen=True)
class SageQuantized:
    """What SageAttention 1.0.6 computes from q, k and v before its attention: int8 codes with fp32 scales per
    block of tokens (Q: 128, K: 64), V in fp16, the fp32 multiplier folded into Q, and the codes a GPU may
    give one apart (:func:`ambiguous`)."""

    q_codes: torch.Tensor  # (B, Hq, Nq, D) int8
    q_scales: torch.Tensor  # (B, Hq, ceil(Nq / 128)) fp32
    k_codes: torch.Tensor  # (B, Hkv, Nk, D) int8
    k_scales: torch.Tensor  # (B, Hkv, ceil(Nk / 64)) fp32
    v: torch.Tensor  # (B, Hkv, Nk, Dv) fp16
    multiplier: float  # RN_f32(sm_scale * L2E)
    q_ambiguous: torch.Tensor  # bool, like q_codes
    k_ambiguous: torch.Tensor  # bool, like k_codes

    def dequantized(self) -> Dequantized:
        """Codes times scales, and V, in float64, exactly."""
        return Dequantized(_dequantize(self.q_codes, self.q_scales, Q_BLOCK),
                           _dequantize(self.k_codes, self.k_scales, K_BLOCK), self.v.to(torch.float64))


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_tensor(x, name)
        if x.dtype != q.dtype:
            raise InvalidArgument(name, x, f"is {x.dtype}, q is {q.dtype}", "Pass q, k and v in one dtype.")
    if q.shape[-1] not in HEAD_DIMS or k.shape[-1] != q.shape[-1]:
        raise InvalidArgument("k", k, f"head dims {q.shape[-1]} (q) and {k.shape[-1]} (k)",
                              f"SageAttention 1.0.6 takes q and k of one head dim among {list(HEAD_DIMS)}.")


def sage_quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
                  smooth_k: bool = True) -> SageQuantized:
    """SageAttention 1.0.6's quantization of q, k, v laid out (B, H, N, D), as ``sageattn`` does it before its
    attention: K smoothed (``smooth_k``, without touching the caller's k), Q and K quantized, V cast to fp16
    (ties to even, past 65504 infinite). ``scale`` is the softmax scale, head dim ** -0.5 by default."""
    _check_inputs(q, k, v)
    sm_scale = q.shape[-1] ** -0.5 if scale is None else scale
    multiplier = sm_scale * L2E  # in Python's double, rounded to fp32 where the kernel receives it
    k = _smoothed(k) if smooth_k else k
    q_codes, q_scales = quantize_blocks(q, Q_BLOCK, multiplier)
    k_codes, k_scales = quantize_blocks(k, K_BLOCK, 1.0)
    return SageQuantized(q_codes, q_scales, k_codes, k_scales, v.to(torch.float16), _fp32(multiplier, q).item(),
                         ambiguous(q, Q_BLOCK, multiplier), ambiguous(k, K_BLOCK, 1.0))


_smoothed = smooth_k  # sage_quantize's keyword shadows the function's name
