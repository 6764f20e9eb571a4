"""What the hosts of ``flashcheck:triton``'s forward and backward kernels pass alike: ALiBi's alignment and the
fp32 zero that stands for absent sinks and slopes. Both import it from here, so neither imports the other for it
(the forward's autograd backward imports the backward module; a planted backward bug redirects that import)."""

from __future__ import annotations

import torch

__all__ = ["alibi_offset", "fp32_zero"]


def alibi_offset(alibi: str, n_q: int, n_k: int) -> int:
    """ALiBi's distance j - (i + offset): symmetric is bottom-right aligned (flash-attention's), linear is not."""
    return n_k - n_q if alibi == "symmetric" else 0


def fp32_zero(q) -> torch.Tensor:
    """One fp32 zero on q's device: the sinks and slopes a case without them passes (a slope of 0 adds 0)."""
    return torch.zeros(1, dtype=torch.float32, device=q.device)
