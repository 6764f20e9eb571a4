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


def cancelling_group_case(upstream: float = 6.25, *, dtype=torch.float16) -> tuple[AttentionCase, torch.Tensor]:
    """(case, dO): fp16 GQA, 2 query heads on 1 K/V head, 3 queries, 2 keys, scale 16, V = +-50 and dO of
    opposite signs on the two heads. Each head's dK share is +-16 x 3 x 2,500 = +-120,000 (past 65,504) and
    the shares cancel: the exact dK is 0, every dS is 2,500 and scale x dS 40,000 (inside fp16's range).
    ``upstream`` 1 keeps each share at 19,200: the control."""
    q = torch.ones(1, 2, 3, 16, dtype=dtype)
    k = torch.zeros(1, 1, 2, 16, dtype=dtype)
    v = torch.tensor([50.0, -50.0], dtype=dtype).reshape(1, 1, 2, 1).expand(1, 1, 2, 16).contiguous()
    do = torch.full((1, 2, 3, 16), upstream, dtype=dtype)
    do[:, 1] = -upstream
    return AttentionCase.create(q, k, v, scale=16.0), do
