"""A serving-form kernel that quantizes inside: its sequences' logical problems as its quantizer sees them.

The oracle of each group of sequences attends the values the kernel's quantizer gives (its scheme's
:data:`~flashcheck.contract.quantization.QUANTIZERS`, emulated in :mod:`flashcheck.numerics.quantized_inside`), as
for a dense kernel. Most of a quantizer works within one sequence (blocks of its tokens), which a group's dense
case holds. A step that reads the whole packed batch cannot be seen from one group: it runs here, on the very
tensor the kernel receives (the physical form, on the device), and its result goes into the groups' inputs.

SageAttention's varlen call (``sage_int8_packed``) has one: k less its mean over every packed token. So the mean,
and with it every sequence's codes, depends on the other sequences' keys. That is its documented convention, not a
leak: :func:`reads_every_key` tells the serving judge, whose isolation property then judges the run with other
sequences poisoned against that batch's own quantized problem instead of asking for the same bits.
"""

from __future__ import annotations

import dataclasses

import torch

from ..numerics.sage_packed import packed_mean
from .serving import ServingCase

__all__ = ["with_scheme", "reads_every_key", "as_quantized"]


def _smooth_packed_k(case: ServingCase, device) -> ServingCase:
    """``case`` with its keys less their mean over the packed batch, computed as ``sageattn_varlen`` computes it."""
    mean = packed_mean(case.physical(device).tensors[1])  # (1, Hkv, D): every owned key of every sequence
    base = case.base
    smoothed = base.k.to(device) - mean.transpose(0, 1).unsqueeze(0)  # one rounding to k's dtype, as in place
    return case.with_base(dataclasses.replace(base, k=smoothed.to(base.k.device)))


# The quantizers with a step over the packed batch, and that step.
_PACKED_STEPS = {"sage_int8_packed": _smooth_packed_k}


def with_scheme(case: ServingCase, scheme) -> ServingCase:
    """``case`` with its variant naming the kernel's quantization ``scheme`` (a quantizer's: the oracle attends its
    values), as a dense case is given it."""
    base = case.base
    return case.with_base(dataclasses.replace(base, variant=base.variant.replace(quantization=scheme)))


def reads_every_key(scheme) -> bool:
    """Whether the quantizer of ``scheme`` makes one sequence's codes depend on the other sequences' keys."""
    return scheme.quantizer in _PACKED_STEPS


def as_quantized(case: ServingCase, device) -> ServingCase:
    """``case`` as its variant's quantizer sees it before quantizing each sequence: the packed step done (a case of
    no such quantizer is returned as it is). Its groups' logical problems are what the oracle attends."""
    step = _PACKED_STEPS.get(case.variant.quantization.quantizer)
    return case if step is None else step(case, torch.device(device))
