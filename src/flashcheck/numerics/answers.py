"""The oracles' answers: :class:`Reference` for the forward pass and :class:`Gradients` for the backward,
float64 tensors each with a certified bound on its own error, whichever method computed them (the float64
walk of :mod:`.oracle` and :mod:`.gradients`, or mpmath in :mod:`.exact`)."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass

import torch

from ..contract.validation import Shapes
from ..features.registry import REGISTRY

__all__ = ["GRADIENTS", "VARIANT_GRADIENTS", "Gradients", "Reference"]

GRADIENTS = ("dq", "dk", "dv")
VARIANT_GRADIENTS = tuple(f.gradient for f in REGISTRY if f.gradient)  # each tensor feature's, where judged


@dataclass
class Reference:
    """The oracle's answer for one attention call.

    All arrays are float64 torch tensors on the input's device, indexed (B, Hq, rows, ...):

    - ``out`` (B, Hq, R, Dv): the attention output; NaN on rows with no visible key.
    - ``lse`` (B, Hq, R): natural-log log-sum-exp of the scaled logits; -inf on empty rows.
    - ``w`` (B, Hq, R, Dv): the weight scale sum_j a_ij |v_jk|, the natural size of output (i, k).
    - ``bound`` (B, Hq, R, Dv): certified bound on |out - exact|; NaN on empty rows.
    - ``lse_bound`` (B, Hq, R): certified bound on |lse - exact|.
    - ``empty_rows`` (B, Hq, R) bool: rows with no visible key.
    - ``rows``: the query indices computed (``None``: all).
    """

    out: torch.Tensor
    lse: torch.Tensor
    w: torch.Tensor
    bound: torch.Tensor
    lse_bound: torch.Tensor
    empty_rows: torch.Tensor
    method: str
    rows: torch.Tensor | None = None
    dps: int | None = None
    shapes: Shapes | None = field(default=None, repr=False)
    inputs: dict | None = field(default=None, repr=False)  # the call it answers, for budgets


@dataclass
class _Gradients:
    """The oracle's gradients for one attention call and upstream gradient, float64 on the inputs' device.

    ``dq`` (B, Hq, Nq, D), ``dk`` (B, Hkv, Nk, D), ``dv`` (B, Hkv, Nk, Dv), each with a certified bound
    on its error (``bound["dq"]``, ...) and its natural scale (``scale["dq"]``: the sum of the absolute
    terms behind each element before they cancel, with P_ij (|dP_ij| + |D_i|) for dS_ij; what an error is
    measured against). ``forward`` is the forward oracle's answer on the same call.

    The variant's own gradients (:mod:`.variant_gradients`) follow, one field each, named as the tensor
    feature's ``gradient`` (:data:`VARIANT_GRADIENTS`): each in its tensor's shape, None where the case has no
    such tensor; their bounds and scales are in ``bound`` and ``scale``.
    """

    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor
    bound: dict[str, torch.Tensor]
    scale: dict[str, torch.Tensor]
    forward: Reference
    method: str
    dps: int | None = None
    shapes: Shapes | None = field(default=None, repr=False)
    ds_max: float = 0.0  # the largest exact |dS_ij| (the spec's gradient exclusions read it)

    def __getitem__(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    @property
    def names(self) -> tuple[str, ...]:
        """The gradients this call has: dq, dk, dv, then the variant's own where it has them."""
        return GRADIENTS + tuple(n for n in VARIANT_GRADIENTS if getattr(self, n) is not None)


# The variant gradients' fields come from the registry, so that a feature with a gradient needs no line here.
Gradients = make_dataclass("Gradients", [(n, "torch.Tensor | None", field(default=None)) for n in VARIANT_GRADIENTS],
                           bases=(_Gradients,), namespace={"__doc__": _Gradients.__doc__})
Gradients.__module__ = __name__
