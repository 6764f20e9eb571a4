"""Comparison of a kernel's (out, lse) with the oracle, through flashcheck's own error model.

Shared by the interpreter and GPU tests so that no test writes a tolerance of its own.
"""

from __future__ import annotations

import torch

from flashcheck.judge.comparison import compare
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.oracle import reference_attention


def reference(q, k, v, *, scale, causal, attn_mask=None):
    return reference_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


def assert_close_to_reference(out, lse, q, k, v, *, scale, causal, attn_mask=None, tf32=False):
    """Assert (out, lse) is inside the budget of the flash contract (tf32 for fp32 when ``tf32``).

    Fully masked rows must give out = 0 and lse = -inf. Returns the worst error/budget ratio.
    """
    B, Hq, Nq, _ = q.shape
    assert out.shape == (B, Hq, Nq, v.shape[-1]) and out.dtype == q.dtype, (out.shape, out.dtype)
    assert lse.shape == (B, Hq, Nq) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    precision = "flash" if tf32 else "strict"
    budget = error_budget(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, precision=precision)
    findings, ratio = compare(out, lse, budget, fully_masked_rows="zero")
    assert not findings, "\n".join(f.summary() for f in findings)
    return ratio
