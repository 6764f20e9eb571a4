"""Checks the tensor-valued features share: a finite floating-point tensor of the dims a feature takes, and its
few-character description."""

from __future__ import annotations

import math

import torch

from ..errors import InvalidArgument

__all__ = ["as_float_tensor", "as_tensor", "head_values_text"]


def as_tensor(name: str, value, fix: str) -> torch.Tensor:
    """``value`` as a tensor, or an :class:`InvalidArgument` naming ``name``."""
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidArgument(name, value, "not a tensor", fix) from None


def as_float_tensor(name: str, value, fix: str, dims: tuple) -> torch.Tensor:
    """``value`` as a detached, non-empty floating-point tensor of one of ``dims`` dims, with no NaN or +inf."""
    t = as_tensor(name, value, fix)
    if t.dim() not in dims or t.numel() == 0 or not t.is_floating_point():
        raise InvalidArgument(name, tuple(t.shape), f"expected a non-empty floating-point tensor of {dims} dims",
                              fix)
    if bool(torch.isnan(t).any()) or bool((t == math.inf).any()):
        raise InvalidArgument(name, value, "contains NaN or +inf", fix)
    return t.detach()


def head_values_text(value: torch.Tensor) -> str:
    """The first four values, as ``[0.5,-inf,1,2,..]``."""
    flat = value.flatten()
    return "[" + ",".join(f"{x:.4g}" for x in flat.tolist()[:4]) + (",..]" if flat.numel() > 4 else "]")
