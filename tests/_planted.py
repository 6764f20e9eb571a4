"""A defect shared by the planted kernels of the CLI and robustness tests."""

from flashcheck.numerics.twin import twin_attention


def wrong_scale_past(out, row: int, factor: float, q, k, v, *, scale, causal, attn_mask=None):
    """``out`` with the rows from ``row`` on computed with the scale off by ``factor``: a tail defect."""
    if q.shape[2] <= row:
        return out
    bad, _ = twin_attention(q, k, v, scale=scale * factor, causal=causal, attn_mask=attn_mask)
    out = out.clone()
    out[:, :, row:] = bad[:, :, row:]
    return out
