"""Facts about the floating-point formats flashcheck tests: names, torch dtypes, unit roundoffs.

This is one of the few places where numbers about rounding live; the oracle and the error model
take them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InvalidArgument

__all__ = ["FloatFormat", "FORMATS", "format_of", "dtype_named", "name_of_dtype"]


@dataclass(frozen=True)
class FloatFormat:
    """One IEEE-style binary format.

    ``unit_roundoff`` is u = 2^-p for p significand bits (round to nearest), ``subnormal_spacing``
    the distance between adjacent subnormals (the absolute rounding step near zero).
    """

    name: str
    dtype: torch.dtype
    significand_bits: int  # including the implicit bit
    min_exponent: int  # exponent of the smallest normal number
    max_value: float

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -self.significand_bits

    @property
    def subnormal_spacing(self) -> float:
        return 2.0 ** (self.min_exponent - self.significand_bits + 1)

    @property
    def smallest_normal(self) -> float:
        return 2.0**self.min_exponent


FORMATS: dict[str, FloatFormat] = {
    "fp16": FloatFormat("fp16", torch.float16, 11, -14, 65504.0),
    "bf16": FloatFormat("bf16", torch.bfloat16, 8, -126, float(torch.finfo(torch.bfloat16).max)),
    "fp32": FloatFormat("fp32", torch.float32, 24, -126, float(torch.finfo(torch.float32).max)),
}
# tf32 keeps fp32's range with 10 explicit mantissa bits; float64 is the oracle's format.
TF32 = FloatFormat("tf32", torch.float32, 11, -126, float(torch.finfo(torch.float32).max))
FP64 = FloatFormat("fp64", torch.float64, 53, -1022, float(torch.finfo(torch.float64).max))

_BY_DTYPE = {f.dtype: f for f in FORMATS.values()}


def dtype_named(name: object, *, argument: str = "dtype") -> torch.dtype:
    """The torch dtype for ``"fp16"``, ``"bf16"`` or ``"fp32"`` (a torch dtype is accepted too)."""
    return format_of(name, argument=argument).dtype


def format_of(value: object, *, argument: str = "dtype") -> FloatFormat:
    """The :class:`FloatFormat` of a dtype name, a torch dtype, or a tensor."""
    if isinstance(value, torch.Tensor):
        value = value.dtype
    if isinstance(value, torch.dtype):
        if value in _BY_DTYPE:
            return _BY_DTYPE[value]
    elif isinstance(value, str) and value in FORMATS:
        return FORMATS[value]
    raise InvalidArgument(
        argument,
        value,
        "flashcheck tests float16, bfloat16 and float32 attention only",
        f"Use one of {sorted(FORMATS)} (or torch.float16 / torch.bfloat16 / torch.float32).",
    )


def name_of_dtype(dtype: torch.dtype, *, argument: str = "dtype") -> str:
    return format_of(dtype, argument=argument).name
