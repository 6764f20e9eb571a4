"""Plain-callable attention kernels with planted bugs, and their fixed twin, for the reproducer tests.

They follow flashcheck's calling convention but import nothing of flashcheck: a reproducer must run where
flashcheck is not installed, with only torch and the kernel's own module. fp32 scores, softmax and P @ V, the
output rounded once: a correct kernel under the "flash" precision contract."""

import torch


class _ScaledGradient(torch.autograd.Function):
    """The identity forward; the gradient multiplied by ``factor`` backward (a wrong backward, exact forward)."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def _attention(q, k, v, *, scale, causal, attn_mask=None):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    n_q, n_k = s.shape[-2:]
    visible = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device)
    if causal == "top_left":
        visible = visible.tril()
    elif causal == "bottom_right":
        visible = visible.tril(n_k - n_q)
    if attn_mask is not None:
        visible = visible & attn_mask
    p = torch.softmax(s.masked_fill(~visible, -torch.inf), -1).nan_to_num(0.0)  # empty rows: 0
    return (p @ v.float()).to(q.dtype)


def fixed(q, k, v, *, scale, causal, attn_mask=None):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


def one_element_off(q, k, v, *, scale, causal, attn_mask=None):
    """The last query row's first column is off by a quarter of its size: one wrong element."""
    out = _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    out[:, :, -1, 0] += 0.25 * (out[:, :, -1, 0].abs() + 1)
    return out


def wrong_dv(q, k, v, *, scale, causal, attn_mask=None):
    """An exact forward whose backward gives dV 1% too large."""
    return _attention(q, k, _ScaledGradient.apply(v, 1.01), scale=scale, causal=causal, attn_mask=attn_mask)
