"""The quantization error of a case: how far its quantized inputs' exact answer is from its full-precision inputs'.

A kernel on quantized inputs is judged against the values it was given (codes times scales): that verdict is
about its arithmetic. How much the quantization itself moved the answer is a second statement, reported apart
and never part of a verdict: the float64 outputs of both problems compared, by their largest difference and by
the cosine similarity the field quotes for quantized attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..contract.quantization import scheme_named
from ..numerics.oracle import reference_attention
from .case import AttentionCase
from .recipe import Recipe
from .serving import ServingCase
from .serving_inside import as_quantized, with_scheme

__all__ = ["QuantizationError", "quantization_error"]


@dataclass(frozen=True)
class QuantizationError:
    """The exact outputs of a case's quantized and full-precision inputs compared."""

    max_abs: float  # max |O_quantized - O_full|
    max_rel: float  # max_abs over max |O_full|
    cosine: float  # of the two outputs, flattened

    def text(self) -> str:
        return (f"quantization error (the inputs' quantization against their full-precision values; not part of the "
                f"verdict): max |dO| {self.max_abs:.3g} ({self.max_rel:.3g} of max |O|), cosine {self.cosine:.6f}")

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def quantization_error(case: AttentionCase | ServingCase, scheme=None) -> QuantizationError | None:
    """The case's quantization error: for a kernel whose ``scheme`` quantizes inside, its quantizer's values
    against the case's (a serving case's sequences all together); else where the case's recipe (in its provenance)
    gives its full-precision values. None for a case that is not quantized or whose values were reshaped after
    their quantization."""
    scheme = None if scheme is None else scheme_named(scheme)
    if isinstance(case, ServingCase):
        return _serving(case, scheme) if scheme is not None and scheme.quantizer else None
    shared = dict(scale=case.scale, causal=case.causal, attn_mask=case.attn_mask)
    if scheme is not None and scheme.quantizer:
        inside = case.variant.replace(quantization=scheme)
        return _compared(reference_attention(case.q, case.k, case.v, variant=inside, **shared).out,
                         reference_attention(case.q, case.k, case.v, variant=case.variant, **shared).out)
    recipe = (case.provenance or {}).get("recipe") if case.variant.quantized else None
    source = Recipe.from_dict(recipe).source_values() if recipe else None
    if source is None:
        return None
    quantized = reference_attention(case.q, case.k, case.v, variant=case.variant, **shared).out
    full = reference_attention(*source, variant=case.variant.unquantized(), **shared).out
    return _compared(quantized, full)


def _serving(case: ServingCase, scheme) -> QuantizationError | None:
    """Each sequence group's exact output on its quantizer's values (a step over the packed batch included: on
    the CPU, where the case is) against its own, all groups' outputs compared as one."""
    inside = as_quantized(with_scheme(case, scheme), "cpu").groups
    outputs = [reference_attention(g.case.q, g.case.k, g.case.v, scale=case.scale, causal=case.causal,
                                   attn_mask=g.case.attn_mask, variant=g.case.variant).out.flatten()
               for groups in (inside, case.groups) for g in groups]
    if not outputs:
        return None
    half = len(outputs) // 2
    return _compared(torch.cat(outputs[:half]), torch.cat(outputs[half:]))


def _compared(quantized: torch.Tensor, full: torch.Tensor) -> QuantizationError:
    rows = torch.isfinite(full) & torch.isfinite(quantized)
    diff = (quantized - full)[rows].abs()
    top = float(full[rows].abs().max()) if bool(rows.any()) else 0.0
    a, b = quantized[rows].flatten(), full[rows].flatten()
    norms = float(a.norm() * b.norm())
    return QuantizationError(float(diff.max()) if diff.numel() else 0.0,
                             float(diff.max()) / top if top > 0 and diff.numel() else 0.0,
                             float(a @ b) / norms if norms > 0 else 1.0)
