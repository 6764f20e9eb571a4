"""A CPU model of fla-core 0.6.0's ``attn_decoding_one_step`` (``naive_attn_decoding_kernel``), for the tests
that classify its half-precision findings.

Its kernel rounds ``q * scale`` to the input dtype, multiplies q by each key element-wise in that dtype and
reduces the products with ``tl.sum``, which keeps a float input's dtype (Triton upcasts only small ints), so a
score is a sum rounded at every step in fp16 or bf16. Compiled by Triton 3.6 for an H100 (its PTX), each thread
sums a run of 8 products with fused multiply-adds from the second product on, and the runs meet in a halving
butterfly: the defect model ``prescaled_sums_in``'s order of that name. The softmax and P @ V that follow run in
fp32, as here; ``score_dtype=torch.float32`` is the control, the scores summed in fp32.
"""

from __future__ import annotations

import torch

from flashcheck.contract.spec import Kernel
from flashcheck.defects.library import _FUSED_SUMS, rounding
from flashcheck.kernels.fla import _decoding, decoding_spec

_ORDER = _FUSED_SUMS["runs of 8 as multiply-adds from the second product, then pairwise"]
_FORMAT = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _one_query(q, k, v, scale, sink, score_dtype):
    """One query (HQ, K) against its keys (T, HQ, K) and values (T, HQ, V) (kv heads already expanded)."""
    if score_dtype is None:
        q_scaled = (q.float() * scale).to(q.dtype)
        s = _ORDER(q_scaled.float()[None] * k.float(), rounding(_FORMAT[q.dtype]))  # (T, HQ)
    else:
        s = ((q.float() * scale)[None] * k.float()).sum(-1)
    m = s.amax(0) if len(s) else torch.zeros(q.shape[0])
    p = torch.exp(s - m)
    total = p.sum(0) + (torch.exp(sink.float() - m) if sink is not None else 0.0)
    o = (p[..., None] * v.float()).sum(0) / torch.where(total > 0, total, 1.0)[:, None]
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
