"""A campaign's sample of its quantized cases' quantization error (fp8 cases, cases that hold a scheme's codes in its
compute format, or any case of a kernel that quantizes inside; :mod:`flashcheck.inputs.quantization_error`): how far
the quantization moved each sampled case's exact answer, counted in the summary beside the verdicts, never in them."""

from __future__ import annotations

import time

from ..contract.quantization import scheme_named
from ..inputs.case import AttentionCase
from ..inputs.serving import ServingCase
from ..inputs.quantization_error import quantization_error

__all__ = ["QUANTIZATION_SAMPLE", "sample_quantization_error"]

# One judged drawn case in this many of each fp8 dtype is measured: it costs a draw and two oracles' work.
QUANTIZATION_SAMPLE = 4


def sample_quantization_error(result, verdict, case, recipe, *, drawn: bool) -> None:
    """Count a drawn, judged quantized case's quantization error (a dense case, or any form's of a kernel that
    quantizes inside) in ``result`` (a CampaignResult) if the sample takes it; its time is the oracle's. ``case`` is
    None where a worker process drew it: drawn again from its recipe."""
    scheme = scheme_named(recipe.scheme)
    inside = scheme.quantizer is not None  # a kernel that quantizes its inputs itself
    if not drawn or verdict.skipped or not (scheme.holds_codes(recipe.dtype) or inside) \
            or (recipe.form != "dense" and not inside) or result.by_dtype[recipe.dtype] % QUANTIZATION_SAMPLE != 1:
        return
    start = time.monotonic()
    error = quantization_error(case if isinstance(case, (AttentionCase, ServingCase)) else recipe.build(),
                               recipe.scheme if inside else None)
    if error is not None:
        result.count_quantization(recipe.dtype, error)
    result.time_split["oracle"] += time.monotonic() - start
