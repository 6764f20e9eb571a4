"""Attention sinks (gpt-oss): ``sinks``, one fp32 logit per query head, (Hq,), added to each row's denominator:
``O_i = sum_j e^s_ij v_j / (sum_j e^s_ij + e^sink)`` and ``lse_i = log(sum_j e^s_ij + e^sink)``. A row with no
visible key has ``O = 0`` and ``lse = sink``. A sink of -inf is no sink: the feature's neutral value."""

from __future__ import annotations

import math

import torch

from ..errors import InvalidArgument
from .base import Feature
from .tensors import as_tensor, head_values_text

__all__ = ["FEATURE"]


def _check(sinks):
    if sinks is None:
        return None
    fix = "Pass sinks as a float32 tensor of one logit per query head, shape (Hq,); -inf is no sink."
    t = as_tensor("sinks", sinks, fix)
    if t.dim() != 1 or t.numel() == 0 or not t.is_floating_point():
        raise InvalidArgument("sinks", sinks, "expected a 1-D floating-point tensor of shape (Hq,)", fix)
    t = t.detach().to("cpu", torch.float32).clone()
    if bool(torch.isnan(t).any()) or bool((t == math.inf).any()):
        raise InvalidArgument("sinks", sinks, "contains NaN or +inf", fix)
    return t


def _shape_problem(sinks, shapes):
    if sinks.numel() != shapes.heads_q:
        return (tuple(sinks.shape), f"expected one sink per query head ({shapes.heads_q})",
                f"Pass sinks of shape ({shapes.heads_q},).")
    return None


def _neutral(variant, causal: str, spec, shapes):
    return ("sinks of -inf", variant.replace(sinks=torch.full((shapes.heads_q,), -math.inf)), causal)


def _heads(draw):
    return lambda gen, s: draw(gen, s.heads_q)


FEATURE = Feature(
    name="sinks", flag="sinks", term="sink", summary="one logit per query head added to each row's denominator",
    check=_check, text=head_values_text, tensor=True, dims=lambda value: (None, -1), shape_problem=_shape_problem,
    # logits of the value regimes sit near 0..10 (10^4.. huge)
    regimes={
        "none": None,
        "moderate": _heads(lambda gen, h: 2 * torch.randn(h, generator=gen)),
        "above": _heads(lambda gen, h: 30 + torch.rand(h, generator=gen)),  # the sink takes most of each row
        "below": _heads(lambda gen, h: -30 - torch.rand(h, generator=gen)),
        "mixed": _heads(lambda gen, h: torch.tensor([-math.inf, -50.0, 0.0, 50.0])[torch.randint(0, 4, (h,),
                                                                                                 generator=gen)]),
    },
    neutral=_neutral, gradient="dsinks",
    neutral_text="sinks of -inf",
)
