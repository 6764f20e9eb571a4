"""Kernels for the sign-off report tests, importable as tests.report._kernels:NAME."""

import flashcheck
from tests.cli._planted import SPEC, correct


@flashcheck.kernel(**SPEC)
def fp32_through_bf16(q, k, v, *, scale, causal, attn_mask=None):
    """Exact attention of the inputs rounded to bf16: an fp32 kernel off by bf16's rounding, which the
    Triton tutorial's atol=1e-2 lets through on ordinary values and flashcheck's fp32 budget does not."""
    rounded = [t.bfloat16().to(t.dtype) for t in (q, k, v)]
    return correct(*rounded, scale=scale, causal=causal, attn_mask=attn_mask)
