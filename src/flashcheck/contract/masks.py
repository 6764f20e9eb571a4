"""Attention masks as small named pure functions.

A *mask function* has the signature ``mask(b, h, q_idx, kv_idx) -> bool tensor`` on broadcastable
integer index tensors and returns ``True`` where query ``q_idx`` may attend key ``kv_idx`` (the
FlexAttention ``mask_mod`` convention). Functions that need parameters are built by a named factory.
:func:`materialize` turns any of them into the boolean (B, H, Nq, Nk) tensor the calling convention
takes. A feature that restricts the keys a query sees builds its mask functions in its own module
(:mod:`flashcheck.features`).
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..errors import InvalidArgument
from .validation import check_causal

__all__ = [
    "MaskFn",
    "full",
    "causal_top_left",
    "causal_bottom_right",
    "causal",
    "key_padding_right",
    "key_padding_left",
    "sliding_window",
    "from_tensor",
    "and_masks",
    "or_masks",
    "materialize",
    "visible",
]

MaskFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def full(b, h, q_idx, kv_idx):
    """Every query sees every key."""
    return torch.ones_like(q_idx - kv_idx, dtype=torch.bool)


def causal_top_left(b, h, q_idx, kv_idx):
    """Query i sees keys j <= i (PyTorch's ``is_causal=True``)."""
    return kv_idx <= q_idx


def causal_bottom_right(n_q: int, n_k: int) -> MaskFn:
    """Query i sees keys j <= i + n_k - n_q (the flash-attention convention): the last query sees all."""
    offset = int(n_k) - int(n_q)

    def causal_bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return causal_bottom_right


def causal(mode: str, n_q: int, n_k: int) -> MaskFn:
    """The mask function of a causal alignment name: ``"none"``, ``"top_left"``, ``"bottom_right"``."""
    mode = check_causal(mode, "mode")
    if mode == "none":
        return full
    if mode == "top_left":
        return causal_top_left
    return causal_bottom_right(n_q, n_k)


def _lengths(lengths: Sequence[int] | torch.Tensor, argument: str) -> torch.Tensor:
    t = torch.as_tensor(lengths, dtype=torch.int64).reshape(-1)
    if t.numel() == 0 or bool((t < 0).any()):
        raise InvalidArgument(argument, lengths, "expected one non-negative key count per batch entry",
                              "Pass a list like [N_k, N_k - 3] with one length per batch entry.")
    return t


def key_padding_right(lengths: Sequence[int] | torch.Tensor) -> MaskFn:
    """Batch entry b has ``lengths[b]`` real keys at the start; the rest is padding on the right."""
    lens = _lengths(lengths, "lengths")

    def key_padding_right(b, h, q_idx, kv_idx):
        return kv_idx < lens.to(kv_idx.device)[b]

    return key_padding_right


def key_padding_left(lengths: Sequence[int] | torch.Tensor, n_k: int) -> MaskFn:
    """Batch entry b has ``lengths[b]`` real keys at the end; the padding is on the left."""
    lens = _lengths(lengths, "lengths")
    n_k = int(n_k)

    def key_padding_left(b, h, q_idx, kv_idx):
        return kv_idx >= n_k - lens.to(kv_idx.device)[b]

    return key_padding_left


def sliding_window(left: int, right: int = 0, *, offset: int = 0) -> MaskFn:
    """Query i sees keys j with ``i + offset - left <= j <= i + offset + right``.

    ``offset = n_k - n_q`` aligns the window bottom-right; ``right=0`` makes it causal.
    """
    for name, side in (("left", left), ("right", right)):
        if int(side) < 0:
            raise InvalidArgument(name, side, "window sides must be non-negative", "Pass left >= 0 and right >= 0.")
    left, right, offset = int(left), int(right), int(offset)

    def sliding_window(b, h, q_idx, kv_idx):
        centre = q_idx + offset
        return (kv_idx >= centre - left) & (kv_idx <= centre + right)

    return sliding_window


def from_tensor(mask: torch.Tensor) -> MaskFn:
    """An arbitrary boolean mask broadcastable to (B, H, Nq, Nk), as a mask function."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.dim() > 4:
        raise InvalidArgument("mask", mask, "expected a torch.bool tensor of at most 4 dimensions",
                              "Pass a boolean tensor of shape (B or 1, H or 1, Nq or 1, Nk or 1) "
                              "or a suffix of it, like attn_mask in the calling convention.")
    # Fewer dims broadcast from the right, as attn_mask does in the calling convention.
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))

    def from_tensor(b, h, q_idx, kv_idx):
        m = mask.to(q_idx.device)
        b = b if m.shape[0] > 1 else torch.zeros_like(b)
        h = h if m.shape[1] > 1 else torch.zeros_like(h)
        q_idx = q_idx if m.shape[2] > 1 else torch.zeros_like(q_idx)
        kv_idx = kv_idx if m.shape[3] > 1 else torch.zeros_like(kv_idx)
        return m[b, h, q_idx, kv_idx]

    return from_tensor


def and_masks(*masks: MaskFn) -> MaskFn:
    """A key is visible when every mask allows it."""

    def and_masks(b, h, q_idx, kv_idx):
        out = full(b, h, q_idx, kv_idx)
        for m in masks:
            out = out & m(b, h, q_idx, kv_idx)
        return out

    return and_masks


def or_masks(*masks: MaskFn) -> MaskFn:
    """A key is visible when any mask allows it."""

    def or_masks(b, h, q_idx, kv_idx):
        out = ~full(b, h, q_idx, kv_idx)
        for m in masks:
            out = out | m(b, h, q_idx, kv_idx)
        return out

    return or_masks


def _shape(shape) -> tuple[int, int, int, int]:
    try:
        sizes = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        sizes = ()
    if len(sizes) != 4 or any(s < 1 for s in sizes):
        raise InvalidArgument("shape", shape, "expected four positive sizes (B, H, Nq, Nk)",
                              "Pass the full attention shape, e.g. (2, 4, 128, 128).")
    return sizes


def materialize(mask: MaskFn, shape: Sequence[int], *, device: str | torch.device = "cpu") -> torch.Tensor:
    """Evaluate a mask function on every (b, h, q, kv) of ``shape = (B, H, Nq, Nk)``."""
    B, H, Nq, Nk = _shape(shape)
    ar = lambda n: torch.arange(n, device=device)  # noqa: E731
    b = ar(B).view(B, 1, 1, 1)
    h = ar(H).view(1, H, 1, 1)
    q_idx = ar(Nq).view(1, 1, Nq, 1)
    kv_idx = ar(Nk).view(1, 1, 1, Nk)
    out = mask(b, h, q_idx, kv_idx)
    return torch.broadcast_to(out.to(torch.bool), (B, H, Nq, Nk)).contiguous()


def visible(causal_mode: str, attn_mask: torch.Tensor | None, shape: Sequence[int],
            *, device: str | torch.device = "cpu", variant=None) -> torch.Tensor:
    """The keys each query may attend under the calling convention's ``causal`` and ``attn_mask``, and
    ``variant``'s (a :class:`~flashcheck.features.variant.Variant`): the keys its features restrict to, less
    those its bias hides."""
    B, H, Nq, Nk = _shape(shape)
    fn = causal(check_causal(causal_mode, "causal_mode"), Nq, Nk)
    extra = None if variant is None else variant.visible(Nq, Nk, H)
    fn = fn if extra is None else and_masks(fn, extra)
    out = materialize(fn, (B, H, Nq, Nk), device=device)
    if attn_mask is not None:
        try:
            dense = torch.broadcast_to(attn_mask.to(device=device, dtype=torch.bool), (B, H, Nq, Nk))
        except RuntimeError:
            raise InvalidArgument("attn_mask", attn_mask, f"does not broadcast to {(B, H, Nq, Nk)}",
                                  "The mask must broadcast to (B, Hq, Nq, Nk).") from None
        out = out & dense
    shown = None if variant is None else variant.shown(Nq, Nk, H)
    if shown is not None:  # keys shown whatever the rest hides (trusted full blocks)
        out = out | materialize(shown, (B, H, Nq, Nk), device=device)
    bias = None if variant is None else variant.bias(Nq, Nk, torch.arange(Nq), device)
    if bias is not None:  # a bias of -inf hides its key
        out = out & torch.broadcast_to(bias > -math.inf, (B, H, Nq, Nk))
    return out
