"""Kernels for the registry's import-path tests (``tests.unit._kernels_fixture:...``)."""

import torch

import flashcheck
from flashcheck.contract.masks import visible


def _attention(q, k, v, *, scale, causal, attn_mask=None):
    # Plain float64 attention, rounded once: just enough to be a real kernel.
    B, Hq, Nq, _ = q.shape
    group = Hq // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1)
    vd = v.double().repeat_interleave(group, dim=1)
    s = scale * (q.double() @ kd.transpose(-1, -2))
    s = s.masked_fill(~visible(causal, attn_mask, (B, Hq, Nq, k.shape[2]), device=q.device), float("-inf"))
    return (torch.softmax(s, dim=-1).nan_to_num(0.0) @ vd).to(q.dtype)


@flashcheck.kernel(dtypes=("fp32",), causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True,
                   fully_masked_rows="zero", precision="strict", devices=("cpu",), name="fixture:decorated")
def decorated(q, k, v, *, scale, causal, attn_mask=None):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


def plain(q, k, v, *, scale, causal, attn_mask=None):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


class Namespace:
    attention = staticmethod(plain)


NOT_CALLABLE = 42
