"""The casts and scale choices of quantized attention kernels and their quantizers, emulated exactly.

A quantized kernel is given codes (fp8, fp4, int8) and scales, and attends their products. To know the
exact values it was given, or the codes it computed itself (P rounded to fp8 before its matmul), flashcheck
repeats the quantizer's steps here in float64: every code of these formats (at most 7 significant bits)
and every power-of-two or float32 scale is a float64 number, and so is their product, exactly; the rounding
of a cast is reproduced bit for bit by scaling onto the format's integer grid, where ``torch.round`` (ties
to even) is exact.

Which value a code is rounded from, per format:

- e4m3, e5m2 and e8m0 (``rounding="nearest"``) are torch's casts, which reach them from float32: a float64
  is first rounded to float32 (c10's fp8 types convert from float), so a float64 a little off a midpoint
  can land on it and tie. e2m1 takes the same path, as the hardware's conversions do (they take float32).
  For a float32 value, and for the float64 quotient of a float32 value and a float32 scale, that first
  step gives float32's own answer (53 >= 2 * 24 + 2: double rounding is innocuous).
- int8 ``"nearest_even"`` is ``torch.round`` of the float64 value itself; ``"half_away"`` is the Triton
  quantizers' ``x + 0.5 * sign(x)`` in float32, then truncation toward zero, so the largest float32 below
  0.5 gives 1, as in those kernels.
- e8m0 ``"up"`` and ``"down"`` are the exact directed roundings of the float64 magnitude (no torch cast).

Past the largest value, ``saturate=False`` gives what torch's own cast gives there, measured on the CPU on
first use, since it changed: e4m3 saturates to +-448, infinities included, in torch 2.13 (pytorch#178817),
and gave NaN before (torch 2.11, CPU and CUDA); e5m2 overflows to +-inf; e8m0 gives NaN. int8 and e2m1 have
no such cast (torch's int8 cast truncates and wraps; torch has no e2m1 cast), so they saturate only.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from ..contract.formats import FORMATS
from ..errors import InvalidArgument

__all__ = ["CodeFormat", "CODE_FORMATS", "code_format", "round_to", "pow2_scale", "to_codes", "SCALE_RULES"]


@dataclass(frozen=True)
class CodeFormat:
    """One quantized code format.

    Its values are those of a binary format of ``significand_bits`` bits (the implicit one included) whose
    smallest normal number is ``2**min_exponent``, up to ``max_value``: int8 is such a format with 7 bits and
    the one exponent 6 (every integer up to 127, spacing 1), e8m0 one with a single bit (powers of two, from
    2^-127: it has no zero). ``roundings`` are the ``rounding`` arguments :func:`round_to` takes for it.
    """

    name: str
    torch_name: str | None  # torch's dtype attribute, where torch has one
    max_value: float
    significand_bits: int
    min_exponent: int
    subnormals: bool
    infinities: bool
    negatives: bool
    zero: bool
    roundings: tuple[str, ...]

    @property
    def dtype(self):
        return None if self.torch_name is None else getattr(torch, self.torch_name)

    @property
    def torch_cast(self) -> bool:
        """Whether :func:`round_to` emulates torch's cast to it (``saturate=False`` then means torch's own
        answer past the range)."""
        return self.torch_name is not None and self.name != "int8"


_FLOAT = ("nearest_even",)
CODE_FORMATS: dict[str, CodeFormat] = {
    # OCP fp8 as torch has it: e4m3 without infinities (its top code is NaN), e5m2 IEEE-like.
    "e4m3": CodeFormat("e4m3", "float8_e4m3fn", 448.0, 4, -6, True, False, True, True, _FLOAT),
    "e5m2": CodeFormat("e5m2", "float8_e5m2", 57344.0, 3, -14, True, True, True, True, _FLOAT),
    # OCP MX fp4: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives; torch's float4_e2m1fn_x2 packs two a byte.
    "e2m1": CodeFormat("e2m1", None, 6.0, 2, 0, True, False, True, True, _FLOAT),
    # Symmetric int8: quantizers clamp to [-127, 127], leaving -128 unused.
    "int8": CodeFormat("int8", "int8", 127.0, 7, 6, True, False, True, True, ("nearest_even", "half_away")),
    # The MX scale format: 2^-127 .. 2^127, code 255 NaN.
    "e8m0": CodeFormat("e8m0", "float8_e8m0fnu", 2.0**127, 1, -127, False, False, False, False,
                       ("nearest", "up", "down")),
}
SCALE_RULES = ("ceil", "ocp")
_E8M0_EXPONENTS = (-127, 127)
_FP32 = FORMATS["fp32"]


def code_format(name: str, *, argument: str = "format") -> CodeFormat:
    """The :class:`CodeFormat` called ``name``."""
    if isinstance(name, str) and name in CODE_FORMATS:
        return CODE_FORMATS[name]
    raise InvalidArgument(argument, name, "not a code format flashcheck emulates",
                          f"Use one of {list(CODE_FORMATS)}.")


def _pow2(k: torch.Tensor) -> torch.Tensor:
    """2.0 ** k for integers -1022 <= k <= 1023, built from its bits (exact, unlike a pow)."""
    return ((k.to(torch.int64) + 1023) << 52).view(torch.float64)


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) of finite nonzero x as int64, exact (frexp normalises float64 subnormals too); 0
    and non-finite x give -1, which callers mask."""
    _, e = torch.frexp(torch.where(torch.isfinite(x), x, 0.0))
    return e.to(torch.int64) - 1


def _on_grid(x: torch.Tensor, significand_bits: int, min_exponent: int) -> torch.Tensor:
    """x rounded to nearest, ties to even, among the numbers of ``significand_bits`` bits at exponents
    from ``min_exponent`` up, unbounded above: x over its quantum is exact, its rounding is torch.round's,
    and so is the product back. Signs of zero kept; NaN and infinities pass through."""
    quantum = _pow2(_exponent(x).clamp(min=min_exponent) - (significand_bits - 1))
    return torch.where(torch.isfinite(x), torch.round(x / quantum) * quantum, x)


def _to_fp32(x: torch.Tensor) -> torch.Tensor:
    """x rounded to float32 (IEEE: past its range by half an ulp, infinite), as float64; computed rather
    than cast, so that no flush-to-zero setting can change it."""
    r = _on_grid(x, _FP32.significand_bits, _FP32.min_exponent)
    return torch.where(r.abs() > _FP32.max_value, torch.copysign(torch.full_like(r, math.inf), r), r)


@functools.cache
def _torch_past_range(name: str) -> tuple[float, float]:
    """What torch's cast to ``name`` gives for a finite magnitude past its largest value and for +inf:
    NaN, inf or the largest value. Measured once, on the CPU, so that a torch that changes it is followed."""
    fmt = CODE_FORMATS[name]
    probe = torch.tensor([fmt.max_value * 1.75, math.inf], dtype=torch.float64)  # finite in float32
    past, inf = probe.to(fmt.dtype).to(torch.float64).tolist()
    return past, inf


def _past_range(r: torch.Tensor, fmt: CodeFormat, saturate: bool, infinite: torch.Tensor) -> torch.Tensor:
    """``r`` (rounded with no upper bound) with its magnitudes past the format's largest value replaced:
    by the largest (``saturate``) or by what torch's cast gives there, the sign kept."""
    past = r.abs() > fmt.max_value  # NaN is never past
    if saturate:
        past_value = inf_value = fmt.max_value
    else:
        past_value, inf_value = _torch_past_range(fmt.name)
    replaced = torch.where(infinite, inf_value, torch.full_like(r, past_value))
    replaced = torch.copysign(replaced, r) if fmt.negatives else replaced
    return torch.where(past, replaced, r)


def _round_float(x: torch.Tensor, fmt: CodeFormat, saturate: bool) -> torch.Tensor:
    v = _to_fp32(x)  # torch's cast from float64 goes through float32 (see the module's docstring)
    r = _on_grid(v, fmt.significand_bits, fmt.min_exponent)
    return _past_range(r, fmt, saturate, torch.isinf(v))


def _round_int8(x: torch.Tensor, rounding: str) -> torch.Tensor:
    if rounding == "half_away":
        v = _to_fp32(x)  # the quantizer's float32 value and sum: the largest float32 below 0.5 sums to 1
        r = torch.trunc(_to_fp32(v + 0.5 * torch.sign(v)))
    else:
        r = torch.round(x)
    # + 0.0 turns -0.0 into +0.0: an integer code has one zero
    return r.clamp(-127.0, 127.0) + 0.0


def _e8m0_nearest(x: torch.Tensor) -> torch.Tensor:
    """The exponent torch's e8m0 cast picks: from the float32 magnitude, up when its significand is 1.5 or
    more (ties up); under float32's normal range (2^-126) 2^-126 for anything above 2^-127, else 2^-127."""
    v = _to_fp32(x).abs()
    significand, e = torch.frexp(torch.where(torch.isfinite(v), v, 0.0))  # v = significand * 2^e
    k = e.to(torch.int64) - 1 + (significand >= 0.75).to(torch.int64)
    tiny = torch.where(v > 2.0**-127, -126, -127)
    return torch.where(v >= _FP32.smallest_normal, k, tiny)


def _e8m0_directed(x: torch.Tensor, rounding: str) -> torch.Tensor:
    v = x.abs()
    k = _exponent(v)
    if rounding == "up":
        k = k + (v != _pow2(k.clamp(-1022, 1023))).to(torch.int64)  # one more where v is no power of two
    return torch.where(v == 0, _E8M0_EXPONENTS[0], k)  # e8m0 has no zero: its smallest value


def _round_e8m0(x: torch.Tensor, rounding: str, saturate: bool) -> torch.Tensor:
    fmt = CODE_FORMATS["e8m0"]
    if rounding == "nearest":
        k, infinite = _e8m0_nearest(x), torch.isinf(_to_fp32(x))  # float32's infinities: torch's too
    else:
        k, infinite = _e8m0_directed(x, rounding), torch.isinf(x)
    lo, hi = _E8M0_EXPONENTS
    r = torch.where(infinite | (k > hi), math.inf, _pow2(k.clamp(lo, hi)))
    r = _past_range(r, fmt, saturate, infinite)
    return torch.where(torch.isnan(x), x, r)


def _checked_tensor(x: object, argument: str) -> torch.Tensor:
    """``x`` as float64: a floating tensor, whose values float64 holds exactly."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise InvalidArgument(argument, x, "not a floating-point tensor",
                              "Pass a float64 tensor (a narrower floating tensor is converted exactly).")
    return x.to(torch.float64)


def _check_options(fmt: CodeFormat, saturate: object, rounding: object) -> None:
    if rounding not in fmt.roundings:
        raise InvalidArgument("rounding", rounding, f"not a rounding of {fmt.name}",
                              f"Pass one of {list(fmt.roundings)}.")
    if not isinstance(saturate, bool):
        raise InvalidArgument("saturate", saturate, "not a bool", "Pass saturate=True or saturate=False.")
    if not saturate and not fmt.torch_cast:
        raise InvalidArgument("saturate", saturate,
                              f"{fmt.name} has no torch cast whose answer past {fmt.max_value:g} could be emulated",
                              "Pass saturate=True: magnitudes past the largest value become it, as quantizers "
                              "clamp them.")


def round_to(x: torch.Tensor, fmt: str, *, saturate: bool = True, rounding: str = "nearest_even") -> torch.Tensor:
    """The values of format ``fmt`` that casting ``x`` gives, as a float64 tensor on ``x``'s device, bit for
    bit (the module's docstring says from which value each format rounds).

    ``saturate=True``: magnitudes past the largest value become +-largest (infinities too), as quantizers
    clamp before they cast; ``saturate=False``: what torch's own cast gives there (float formats with a
    torch cast only). ``rounding``: ``"nearest_even"`` for e4m3, e5m2, e2m1 and int8 (torch.round),
    ``"half_away"`` for int8 as Triton quantizers round; for e8m0 ``"nearest"`` (torch's cast: ties up,
    the sign dropped, 0 and anything under 2^-127 to 2^-127), ``"up"`` or ``"down"``. NaN gives NaN; -0.0
    stays -0.0 where the format has a sign (e4m3, e5m2, e2m1), +0.0 in int8, 2^-127 in e8m0.
    """
    form = code_format(fmt, argument="fmt")
    _check_options(form, saturate, rounding)
    x = _checked_tensor(x, "x")
    if form.name == "e8m0":
        return _round_e8m0(x, rounding, saturate)
    if form.name == "int8":
        return torch.where(torch.isnan(x), x, _round_int8(x, rounding))
    return _round_float(x, form, saturate)


def pow2_scale(amax: torch.Tensor, fmax: float, *, rule: str) -> torch.Tensor:
    """The power-of-two scales, float64, of blocks whose largest magnitudes are ``amax``, for codes whose
    largest value is ``fmax``.

    ``rule="ceil"``: 2^ceil(log2(amax / fmax)), the smallest that lets no code saturate (NVIDIA's MXFP8
    recipe); ``rule="ocp"``: 2^(floor(log2 amax) - floor(log2 fmax)), the OCP MX spec's shared exponent,
    under which the top codes may saturate. Exact: with amax = a 2^ea and fmax = f 2^ef (frexp, a and f in
    [0.5, 1)), floor(log2 amax) - floor(log2 fmax) = ea - ef, and amax / fmax exceeds 2^(ea - ef) just when
    a > f. An all-zero block (amax == 0) gets scale 1; the scales are clamped to e8m0's range, 2^-127 to
    2^127; a block with an infinity or NaN (amax not finite) gets NaN: no scale makes it finite.
    """
    if rule not in SCALE_RULES:
        raise InvalidArgument("rule", rule, "not a scale rule", f"Use one of {list(SCALE_RULES)}.")
    if isinstance(fmax, bool) or not isinstance(fmax, (int, float)) or not 0 < fmax < math.inf:
        raise InvalidArgument("fmax", fmax, "not a positive finite number",
                              "Pass the codes' largest value, e.g. code_format('e4m3').max_value.")
    amax = _checked_tensor(amax, "amax")
    if bool((amax < 0).any()):
        raise InvalidArgument("amax", amax, "holds negative values",
                              "Pass the blocks' largest magnitudes, x.abs().amax(...).")
    a, ea = torch.frexp(torch.where(torch.isfinite(amax), amax, 0.0))
    f, ef = math.frexp(float(fmax))
    k = ea.to(torch.int64) - ef
    if rule == "ceil":
        k = k + (a > f).to(torch.int64)
    k = torch.where(amax == 0, 0, k).clamp(*_E8M0_EXPONENTS)
    return torch.where(torch.isfinite(amax), _pow2(k), math.nan)


def to_codes(x: torch.Tensor, scale: torch.Tensor, fmt: str, *, saturate: bool = True,
             rounding: str = "nearest_even") -> torch.Tensor:
    """The codes a quantizer writes for ``x`` under ``scale`` (broadcastable to ``x``): :func:`round_to` of
    x / scale where scale > 0, and 0 where scale == 0 (an all-zero block's scale: no 0 / 0). The quotient
    is float64's, exact for a power-of-two scale; for float32 x and scales its rounding to float32 is
    float32's own quotient. A NaN scale gives NaN codes."""
    form = code_format(fmt, argument="fmt")
    _check_options(form, saturate, rounding)
    x = _checked_tensor(x, "x")
    scale = _checked_tensor(scale, "scale").to(x.device)
    if bool((scale < 0).any()):
        raise InvalidArgument("scale", scale, "holds negative scales", "Pass scales >= 0 (0 for an all-zero block).")
    zero = scale == 0
    codes = round_to(x / torch.where(zero, 1.0, scale), form.name, saturate=saturate, rounding=rounding)
    return torch.where(zero, 0.0, codes)
