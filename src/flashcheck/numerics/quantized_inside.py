"""Kernels that quantize inside: the values the quantizer a kernel's scheme names
(:data:`~flashcheck.contract.quantization.QUANTIZERS`) gives its fp16, bf16 or fp32 inputs, emulated exactly, which
the oracle attends and the budget measures from; how far they sit from the full-precision inputs is the
quantization error, reported apart (:mod:`flashcheck.inputs.quantization_error`).

An emulation runs on the inputs' device with the kernel's own torch operations where the kernel uses torch (a
mean is then the same bits), and IEEE arithmetic for its Triton arithmetic: bit for bit what the Triton
interpreter computes. Compiled GPU code divides approximately, so a code whose quotient lies within a few ulps of a
rounding boundary may come out one apart there: on CUDA those codes are the values' slack, one code each, which the
budget adds to the logits' error.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import sage

__all__ = ["InsideValues", "inside_values"]


@dataclass(frozen=True)
class InsideValues:
    """q, k and v as the kernel's quantizer leaves them (float64, exact), and ``slack``: (q's, k's) one code
    where compiled code may round it the other way, or None where the emulation is the kernel's arithmetic."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    slack: tuple | None


def _per_token(scales: torch.Tensor, block: int, n: int) -> torch.Tensor:
    return scales.to(torch.float64).repeat_interleave(block, dim=2)[:, :, :n, None]


def _sage_int8(q, k, v, *, scale: float, approximate: bool, smooth_k: bool = True) -> InsideValues:
    """SageAttention 1.0.6: Q's values divided by the fp32 multiplier it folded in (scale x 1.44269504), so that
    the oracle's scale applies as to any kernel; the kernel's exp2 of the folded logits differs from that by the
    multiplier's fp32 rounding and the literal's 6e-10, within the logits' ulps of the budget."""
    quantized = sage.sage_quantize(q, k, v, scale=scale, smooth_k=smooth_k)
    values = quantized.dequantized()
    slack = None
    if approximate:
        one_q = quantized.q_ambiguous.to(torch.float64) * _per_token(quantized.q_scales, sage.Q_BLOCK, q.shape[2])
        one_k = quantized.k_ambiguous.to(torch.float64) * _per_token(quantized.k_scales, sage.K_BLOCK, k.shape[2])
        slack = (one_q / abs(quantized.multiplier), one_k)  # magnitudes: a negative scale folds a negative multiplier
    return InsideValues(values.q / quantized.multiplier, values.k, values.v, slack)


def _sage_int8_packed(q, k, v, *, scale: float, approximate: bool) -> InsideValues:
    """SageAttention 1.0.6's varlen call, on one group of its sequences as a dense batch: k arrives smoothed by the
    mean over the whole packed batch, which only the packed form knows (:mod:`flashcheck.inputs.serving_inside`
    subtracts it first); the rest is the dense call's per sequence (:mod:`.sage_packed`)."""
    return _sage_int8(q, k, v, scale=scale, approximate=approximate, smooth_k=False)


_EMULATIONS = {"sage_int8": _sage_int8, "sage_int8_packed": _sage_int8_packed}


def inside_values(scheme, q, k, v, *, scale: float, approximate: bool | None = None) -> InsideValues:
    """The values the quantizer of ``scheme`` (a :class:`~flashcheck.contract.quantization.Scheme`) gives q, k
    and v (B, H, N, D) for the softmax ``scale``, with their slack where the kernel's code divides approximately
    (``approximate``; by default where the inputs are on CUDA, as compiled code runs)."""
    approximate = q.is_cuda if approximate is None else approximate
    return _EMULATIONS[scheme.quantizer](q, k, v, scale=scale, approximate=approximate)
