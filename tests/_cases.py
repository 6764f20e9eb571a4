"""Hand-built cases that several test folders check."""

from __future__ import annotations

import torch

from flashcheck import AttentionCase


def large_v_case(head_dim: int, head_dim_v: int, scale: float) -> AttentionCase:
    """fp16, 2 queries, 15 keys, V near 1,000, top-left causal: with dO along O, dS passes 65,504
    (FA2 rounds it to fp16, which gives inf, then NaN) while every exact gradient is representable."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 2, head_dim, generator=g).half()
    k = torch.randn(1, 1, 15, head_dim, generator=g).half()
    v = (torch.randn(1, 1, 15, head_dim_v, generator=g) * 1000).half()
    return AttentionCase.create(q, k, v, scale=scale, causal="top_left")
