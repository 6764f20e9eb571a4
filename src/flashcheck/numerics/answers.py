"""The oracles' answers: :class:`Reference` for the forward pass and :class:`Gradients` for the backward,
float64 tensors each with a certified bound on its own error, whichever method computed them (the float64
walk of :mod:`.oracle` and :mod:`.gradients`, or mpmath in :mod:`.exact`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..contract.validation import Shapes

__all__ = ["GRADIENTS", "Gradients", "Reference"]

GRADIENTS = ("dq", "dk", "dv")


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
class Gradients:
    """The oracle's gradients for one attention call and upstream gradient, float64 on the inputs' device.

    ``dq`` (B, Hq, Nq, D), ``dk`` (B, Hkv, Nk, D), ``dv`` (B, Hkv, Nk, Dv), each with a certified bound
    on its error (``bound["dq"]``, ...) and its natural scale (``scale["dq"]``: the sum of the absolute
    terms behind each element before they cancel, with P_ij (|dP_ij| + |D_i|) for dS_ij; what an error is
    measured against). ``forward`` is the forward oracle's answer on the same call.
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
    # The variant's own gradients (variant_gradients): dBias in attn_bias's shape, dSinks (Hq,); None
    # where the case has no such tensor. Their bounds and scales are in ``bound`` and ``scale``.
    dbias: torch.Tensor | None = None
    dsinks: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        return getattr(self, name)

    @property
    def names(self) -> tuple[str, ...]:
        """The gradients this call has: dq, dk, dv, then dbias and dsinks where the variant has them."""
        return GRADIENTS + tuple(n for n in ("dbias", "dsinks") if getattr(self, n) is not None)
