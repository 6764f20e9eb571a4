"""What every adapter of an outside attention backend does first with a call."""

from __future__ import annotations

from ..contract.validation import check_attention_inputs
from ..errors import InvalidArgument


def validated_call(kernel_name: str, device: str, q, k, v, *, scale, causal, attn_mask):
    """Validate one call of an adapter made for ``device``; returns check_attention_inputs' tuple."""
    q, k, v, scale, causal, attn_mask, shapes = check_attention_inputs(
        q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    if q.device.type != device:
        raise InvalidArgument("q", q, f"on {q.device}, but kernel {kernel_name!r} was made for device {device!r}",
                              f"Move q, k, v to {device}, or resolve the kernel for device={q.device.type!r}.")
    return q, k, v, scale, causal, attn_mask, shapes
