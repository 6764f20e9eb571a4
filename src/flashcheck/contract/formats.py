"""Facts about the floating-point formats flashcheck tests: names, torch dtypes, unit roundoffs.

This is one of the few places where numbers about rounding live; the oracle and the error model
take them from here. The table :data:`FORMATS` is also the one list of dtype names (:data:`DTYPES`),
and :data:`DEVICES` the one list of devices: both are read without importing torch (the CLI's
options), so a format names its torch dtype and looks it up on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument

__all__ = ["DEVICES", "DTYPES", "FP8_DTYPES", "QUANTIZED_DTYPES", "ALL_DTYPES", "FloatFormat", "FORMATS", "format_of",
           "dtype_named", "device_named", "name_of_dtype", "output_format", "is_quantized", "bits_dtype", "raw_bits",
           "QUANTIZED_INPUTS", "SCALE_PROPERTY", "SCALE_FINDING", "SCALE_CAUSE"]

DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class FloatFormat:
    """One IEEE-style binary format.

    ``unit_roundoff`` is u = 2^-p for p significand bits (round to nearest), ``subnormal_spacing``
    the distance between adjacent subnormals (the absolute rounding step near zero). A ``quantized`` format
    comes with per-(batch entry, K/V head) scales (:mod:`flashcheck.inputs.quantization`): the case's values
    are its codes times them, and its kernels write another format (:func:`output_format`).
    """

    name: str
    torch_name: str  # the torch dtype's attribute name: torch.float16, ...
    significand_bits: int  # including the implicit bit
    min_exponent: int  # exponent of the smallest normal number
    max_value: float
    quantized: bool = False

    @property
    def dtype(self):
        import torch  # on first use: the CLI reads the formats without torch

        return getattr(torch, self.torch_name)

    @property
    def unit_roundoff(self) -> float:
        return 2.0 ** -self.significand_bits

    @property
    def subnormal_spacing(self) -> float:
        return 2.0 ** (self.min_exponent - self.significand_bits + 1)

    @property
    def smallest_normal(self) -> float:
        return 2.0**self.min_exponent


def _largest(significand_bits: int, max_exponent: int) -> float:
    return (2.0 - 2.0 ** (1 - significand_bits)) * 2.0**max_exponent


FORMATS: dict[str, FloatFormat] = {
    "fp16": FloatFormat("fp16", "float16", 11, -14, _largest(11, 15)),
    "bf16": FloatFormat("bf16", "bfloat16", 8, -126, _largest(8, 127)),
    "fp32": FloatFormat("fp32", "float32", 24, -126, _largest(24, 127)),
    # OCP fp8 as torch and FA3 have them: e4m3 without infinities (its top code is NaN, so 448 is the
    # largest), e5m2 IEEE-like. Their kernels take fp32 descales and write bf16 (FP8_OUTPUT).
    "fp8_e4m3": FloatFormat("fp8_e4m3", "float8_e4m3fn", 4, -6, 448.0, quantized=True),
    "fp8_e5m2": FloatFormat("fp8_e5m2", "float8_e5m2", 3, -14, _largest(3, 15), quantized=True),
}
QUANTIZED_DTYPES = tuple(n for n, f in FORMATS.items() if f.quantized)
FP8_DTYPES = QUANTIZED_DTYPES  # the kernels' name for them
DTYPES = tuple(n for n in FORMATS if n not in QUANTIZED_DTYPES)  # a spec's default: the 16- and 32-bit formats
ALL_DTYPES = tuple(FORMATS)  # the names options, specs and presets accept
FP8_OUTPUT = "bf16"  # the output of an fp8 kernel (FA3's convention)
# The reports' words for quantized inputs, torch-free for the judge's and the report's tables: what they are
# called, the property that rescales them against their scales (the same exact problem), the finding kind it
# gives and the campaign's cause of that finding.
QUANTIZED_INPUTS = "fp8 inputs"
SCALE_PROPERTY = "descale"
SCALE_FINDING = "descale_dependence"
SCALE_CAUSE = ("variant:descale", "fp8 inputs rescaled against their descales (the same exact problem) break the "
                                  "budget: a descale ignored or applied twice")
# tf32 keeps fp32's range with 10 explicit mantissa bits; float64 is the oracle's format.
TF32 = FloatFormat("tf32", "float32", 11, -126, _largest(24, 127))
FP64 = FloatFormat("fp64", "float64", 53, -1022, _largest(53, 1023))


def dtype_named(name: object, *, argument: str = "dtype"):
    """The torch dtype for ``"fp16"``, ``"bf16"`` or ``"fp32"`` (a torch dtype is accepted too)."""
    return format_of(name, argument=argument).dtype


def format_of(value: object, *, argument: str = "dtype") -> FloatFormat:
    """The :class:`FloatFormat` of a dtype name, a torch dtype, or a tensor."""
    if isinstance(value, str):
        if value in FORMATS:
            return FORMATS[value]
    else:
        value = getattr(value, "dtype", value)  # a tensor's dtype
        for f in FORMATS.values():
            if value is f.dtype:
                return f
    raise InvalidArgument(
        argument,
        value,
        "flashcheck tests float16, bfloat16, float32 and fp8 (e4m3, e5m2) attention only",
        f"Use one of {list(FORMATS)} (or torch.float16 / torch.bfloat16 / torch.float32 / torch.float8_e4m3fn / "
        "torch.float8_e5m2).",
    )


def device_named(value: object, *, argument: str = "device"):
    """The torch device ``value`` names ("cpu", "cuda", "cuda:N" or a torch.device of them), one that torch can
    use here: CUDA where torch sees no GPU, or not that many, is refused by name."""
    import torch  # on first use: the CLI reads the formats without torch

    try:
        device = torch.device(value) if isinstance(value, (str, torch.device)) else None
    except (RuntimeError, TypeError, ValueError):
        device = None
    if device is None or device.type not in DEVICES:
        raise InvalidArgument(argument, value, "not a device flashcheck runs on",
                              "Pass 'cpu', 'cuda', 'cuda:N' or a torch.device of one of them.")
    count = torch.cuda.device_count() if device.type == "cuda" and torch.cuda.is_available() else 0
    if device.type == "cuda" and not count:
        raise InvalidArgument(argument, value, "torch sees no CUDA device here",
                              "Pass device='cpu', or run on a machine where torch.cuda.is_available() is True.")
    if device.type == "cuda" and (device.index or 0) >= count:
        raise InvalidArgument(argument, value, f"torch sees {count} CUDA device(s) here",
                              f"Pass 'cuda' or 'cuda:N' with N below {count}.")
    return device


def name_of_dtype(dtype, *, argument: str = "dtype") -> str:
    return format_of(dtype, argument=argument).name


def output_format(value) -> FloatFormat:
    """The format a kernel's output has for inputs of ``value`` (a name, dtype or tensor): the inputs' own,
    bf16 for fp8 inputs."""
    fmt = format_of(value)
    return FORMATS[FP8_OUTPUT] if fmt.quantized else fmt


def is_quantized(value) -> bool:
    """Whether ``value`` (a dtype name, torch dtype or tensor) is of a quantized format; False for anything that is
    not one of :data:`FORMATS` (integers, bool, float64)."""
    try:
        return format_of(value).quantized
    except InvalidArgument:
        return False


def bits_dtype(dtype):
    """The integer torch dtype of ``dtype``'s width, which holds its bits (unsigned for one byte, as numpy and
    ``torch.frombuffer`` read the quantized formats' codes)."""
    import torch  # on first use: the CLI reads the formats without torch

    return {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[dtype.itemsize]


def raw_bits(t):
    """``t`` viewed as integers of its width: copies and comparisons of bits that never do float
    arithmetic (NaN payloads kept, -0.0 apart from +0.0)."""
    return t.view(bits_dtype(t.dtype)) if t.is_floating_point() and t.element_size() in (1, 2, 4, 8) else t
