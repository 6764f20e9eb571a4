"""What every adapter of an outside attention backend does first with a call."""

from __future__ import annotations

import importlib

from ..contract.validation import check_attention_inputs
from ..errors import BackendUnavailable, InvalidArgument


def validated_call(kernel_name: str, device: str, q, k, v, *, scale, causal, attn_mask):
    """Validate one call of an adapter made for ``device``; returns check_attention_inputs' tuple."""
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    if q.device.type != device:
        raise InvalidArgument("q", q, f"on {q.device}, but kernel {kernel_name!r} was made for device {device!r}",
                              f"Move q, k, v to {device}, or resolve the kernel for device={q.device.type!r}.")
    return q, k, v, scale, causal, attn_mask, shapes


def import_backend(kernel_name: str, module: str, *, problem: str, fix: str):
    """The outside backend's ``module``, imported on first use; a :class:`BackendUnavailable` naming
    ``kernel_name``, ``problem`` (with the import's own error) and ``fix`` when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailable(kernel_name, "any", f"{problem} ({exc})", fix) from exc
