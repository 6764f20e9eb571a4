"""A CPU model of fla-core 0.6.0's ``attn_decoding_one_step`` (``naive_attn_decoding_kernel``), for the tests
that classify its half-precision findings.

Its kernel rounds ``q * scale`` to the input dtype, multiplies q by each key element-wise in that dtype and
reduces the products with ``tl.sum``, which keeps a float input's dtype (Triton upcasts only small ints), so a
score is a sum rounded at every step in fp16 or bf16. The softmax and P @ V that follow run in fp32. The model
does the same (the sum as a pairwise tree, since the GPU's reduction order is its own) and then the softmax in
float64; ``score_dtype=torch.float32`` is the control, the same order with fp32 scores.
"""

from __future__ import annotations

import torch

from flashcheck.contract.spec import Kernel
from flashcheck.kernels.fla import _decoding, decoding_spec


def _rounded_sum(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The last dim summed pairwise, every partial sum rounded to ``dtype``."""
    x = x.to(dtype)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.cat([x, torch.zeros_like(x[..., :1])], -1)
        half = x.shape[-1] // 2
        x = (x[..., :half] + x[..., half:]).to(dtype)
    return x[..., 0]


def _one_query(q, k, v, scale, sink, score_dtype):
    """One query (HQ, K) against its keys (T, HQ, K) and values (T, HQ, V) (kv heads already expanded)."""
    if score_dtype is None:
        q_scaled, dtype = (q * scale).to(q.dtype), q.dtype
    else:
        q_scaled, dtype = q.to(score_dtype) * scale, score_dtype
    s = _rounded_sum(q_scaled[None] * k.to(dtype), dtype).double()  # (T, HQ)
    m = s.amax(0) if len(s) else torch.zeros(q.shape[0], dtype=torch.float64)
    p = torch.exp(s - m)
    total = p.sum(0) + (torch.exp(sink.double() - m) if sink is not None else 0.0)
    o = (p[..., None] * v.double()).sum(0) / torch.where(total > 0, total, 1.0)[:, None]
    return o.to(q.dtype)


def model_one_step(score_dtype: torch.dtype | None = None):
    """``attn_decoding_one_step``'s arithmetic with its calling convention: q (1, B, HQ, K) against packed keys
    (1, T, H, K) split by ``cu_seqlens``."""

    def one_step(q, k, v, *, scale, cu_seqlens, window_size=None, sink_bias=None):
        q, k, v = q[0], k[0], v[0]
        group = q.shape[1] // k.shape[1]
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        at = cu_seqlens.tolist()
        out = [_one_query(q[b], k[lo:hi], v[lo:hi], scale, sink_bias, score_dtype)
               for b, (lo, hi) in enumerate(zip(at, at[1:]))
               for lo in [lo if window_size is None else max(lo, hi - window_size)]]
        return torch.stack(out)[None]

    return one_step


def model_kernel(score_dtype: torch.dtype | None = None) -> Kernel:
    """The model through flashcheck's own varlen wrapper of the decoding step, on the CPU."""
    spec = decoding_spec("cpu").replace(dtypes=("fp16", "bf16", "fp32"))
    return Kernel(_decoding(model_one_step(score_dtype)), spec, name="model:fla-attn_decoding")
