"""Precision contracts: what rounding a kernel is allowed to do.

A contract names where a kernel may round (scores, P, accumulators, output) and in which format.
The error model turns a contract into the terms of the per-element budget; nothing else reads these
fields for numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import InvalidArgument
from .quantization import Scheme, scheme_named

__all__ = ["Precision", "PRESETS", "TANH_APPROX_F32", "PrecisionPromises", "precision_named"]

# PTX's tanh.approx.f32: maximum relative error 2^-10.987 over its whole range (the PTX ISA manual).
TANH_APPROX_F32 = 2.0**-10.987

_P_DTYPES = ("input", "fp32")


@dataclass(frozen=True)
class Precision:
    """A precision contract.

    - ``tf32``: for fp32 inputs the two matmuls may run as tf32 (both operands rounded).
    - ``p_dtype``: ``"input"`` if the unnormalised P is rounded to the input dtype before P @ V,
      ``"fp32"`` if it stays in fp32.
    - ``rescales_per_tile``: the accumulator may be rescaled once per key tile (online softmax).
    - ``exp_ulps``: accuracy of the fp32 exp/exp2 the kernel uses, in fp32 ulps.
    - ``scale_on_inputs``: the scale may multiply Q and K (each by sqrt(|scale|), in fp32) before the
      product instead of the scores, as PyTorch's math backend does: two more roundings per logit.
    - ``tanh_error``: the largest absolute error of the fp32 tanh a kernel that caps its logits uses
      (|tanh| <= 1, so a relative error bound serves as well): a few fp32 ulps for libdevice's tanh or a tanh
      built from exp, :data:`TANH_APPROX_F32` for the hardware's ``tanh.approx.f32``.
    """

    name: str = "custom"
    tf32: bool = False
    p_dtype: str = "input"
    rescales_per_tile: bool = True
    exp_ulps: float = 2.0
    scale_on_inputs: bool = False
    tanh_error: float = 2.0**-21

    def __post_init__(self):
        if self.p_dtype not in _P_DTYPES:
            raise InvalidArgument("p_dtype", self.p_dtype, "unknown rounding of P",
                                  f"Use one of {list(_P_DTYPES)}.")
        if not (isinstance(self.exp_ulps, (int, float)) and 0 <= self.exp_ulps < 1e6):
            raise InvalidArgument("exp_ulps", self.exp_ulps, "expected a non-negative number of ulps",
                                  "Pass e.g. exp_ulps=2.")
        if not (isinstance(self.tanh_error, (int, float)) and 0 <= self.tanh_error < 1):
            raise InvalidArgument("tanh_error", self.tanh_error, "expected an absolute error in [0, 1)",
                                  "Pass e.g. tanh_error=2**-21, or flashcheck.contract.precision.TANH_APPROX_F32.")

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


PRESETS: dict[str, Precision] = {
    # Flash-style: fp32 scores (tf32 allowed for fp32 inputs), P rounded to the input dtype.
    "flash": Precision("flash", tf32=True, p_dtype="input", rescales_per_tile=True),
    # IEEE fp32 everywhere: no tf32, P still rounded to the input dtype for the second matmul.
    "strict": Precision("strict", tf32=False, p_dtype="input", rescales_per_tile=True),
    # Upcast: computed in fp32 and rounded once at the end (PyTorch's math backend).
    "upcast": Precision("upcast", tf32=False, p_dtype="fp32", rescales_per_tile=False, scale_on_inputs=True),
}


def precision_named(value: object, *, argument: str = "precision") -> Precision:
    """Resolve a preset name or pass a :class:`Precision` through."""
    if isinstance(value, Precision):
        return value
    if isinstance(value, str) and value in PRESETS:
        return PRESETS[value]
    raise InvalidArgument(argument, value, "unknown precision contract",
                          f"Use one of {sorted(PRESETS)} or a flashcheck.Precision(...).")


@dataclass(frozen=True)
class PrecisionPromises:
    """What rounding a kernel may do and which bits it promises to repeat: the kernel spec's fields of that
    concern (:class:`~flashcheck.contract.spec.KernelSpec` takes and reads them flat).

    ``precision``: a preset's name or a :class:`Precision` (the error budget is built from it).
    ``deterministic``: two identical calls give identical bits (on by default). ``batch_invariant``: a
    sequence gives the same bits alone and inside a batch (off by default: many correct kernels tile
    differently by batch size). ``layout_invariant``: the same numbers in another memory layout give the same
    bits (off by default: compilers and libraries pick other instructions for other strides); without it,
    another layout must still stay within the error budget. ``quantization``: how the kernel's quantized inputs
    are scaled, a :class:`~flashcheck.contract.quantization.Scheme` or its name (read for fp8 dtypes only).
    """

    precision: Precision | str = "flash"
    deterministic: bool = True
    batch_invariant: bool = False
    layout_invariant: bool = False
    quantization: Scheme | str = "per_head"

    def __post_init__(self):
        object.__setattr__(self, "precision", precision_named(self.precision))
        object.__setattr__(self, "quantization", scheme_named(self.quantization))

    def check_with(self, spec) -> None:
        """The scheme against the spec's dtypes."""
        self.quantization.check_dtypes(spec.dtypes)
