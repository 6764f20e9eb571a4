"""The mpmath oracle: attention with ``dps`` decimal digits, row by row, the auditor of the float64 one.

mpmath costs about 0.5 us per multiply-add and 3 us per exp at 50 digits, so it checks the float64
oracle (:func:`flashcheck.numerics.oracle.audit_reference`) and is never the hot path. It computes the
same quantities as :func:`~flashcheck.numerics.oracle.reference_attention`, variants included: the cap with
mpmath's tanh, the sink in each row's sum.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..contract.formats import FP64
from ..contract.validation import Shapes
from ..contract.variants import Variant
from .blockwise import visible_block

__all__ = ["mpmath_reference"]

U64 = FP64.unit_roundoff


# --- mpmath -----------------------------------------------------------------------------------------

def mpmath_reference(q, k, v, scale, causal, attn_mask, shapes: Shapes, row_index, dps, variant) -> "Reference":
    import mpmath

    from .oracle import Reference

    B, Hq, Nq, Dv = shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v
    rows_all = row_index if row_index is not None else torch.arange(Nq)
    R = rows_all.numel()
    out = torch.full((B, Hq, R, Dv), math.nan, dtype=torch.float64)
    w = torch.zeros_like(out)
    lse = torch.full((B, Hq, R), -math.inf, dtype=torch.float64)
    empty = torch.zeros((B, Hq, R), dtype=torch.bool)
    qd, kd, vd = (t.detach().cpu().to(torch.float64).numpy() for t in (q, k, v))
    ctx = mpmath.MPContext()
    ctx.dps = dps
    row = _MpRow(ctx, scale, variant)
    visible = visible_block(causal, None if attn_mask is None else attn_mask.cpu(), shapes, rows_all, "cpu",
                            variant=variant)
    visible = torch.broadcast_to(visible, (B * shapes.heads_kv, shapes.group, R, shapes.n_k)).numpy()
    for b in range(B):
        for kvh in range(shapes.heads_kv):
            K, V = row.to_mp(kd[b, kvh]), row.to_mp(vd[b, kvh])
            for h in range(kvh * shapes.group, (kvh + 1) * shapes.group):
                vis = visible[b * shapes.heads_kv + kvh, h - kvh * shapes.group]
                for r, i in enumerate(rows_all.tolist()):
                    result = row(qd[b, h, i], K, V, np.flatnonzero(vis[r]), h)
                    if result is None:
                        empty[b, h, r] = True
                    else:
                        out[b, h, r], w[b, h, r], lse[b, h, r] = result
    # Each value carries the float64 rounding of a result accurate to about 10^-(dps-5).
    digits = 10.0 ** (5 - dps)
    bound = (U64 * out.abs() + digits * w).masked_fill(empty[..., None], math.nan)
    lse_bound = (U64 * lse.abs() + digits).masked_fill(empty, 0.0)
    device = q.device
    return Reference(out=out.to(device), lse=lse.to(device), w=w.to(device), bound=bound.to(device),
                     lse_bound=lse_bound.to(device), empty_rows=empty.to(device), method="mpmath",
                     rows=row_index, dps=dps, shapes=shapes)


class _MpRow:
    """One row of attention in mpmath: the variant's cap on the scaled logits, its sink in the sum."""

    def __init__(self, ctx, scale, variant: Variant):
        self.ctx, self.scale = ctx, ctx.mpf(scale)
        self.to_mp = np.frompyfunc(ctx.mpf, 1, 1)
        cap = variant.softcap
        self.cap = None if cap in (None, math.inf) else ctx.mpf(cap)
        self.sinks = None if variant.sinks is None else [float(x) for x in variant.sinks.tolist()]

    def __call__(self, q_row, K, V, keys, head):
        """(out, w, lse) of the row over ``keys``, or None when nothing (no key, no sink) is visible."""
        ctx = self.ctx
        sink = None if self.sinks is None or self.sinks[head] == -math.inf else ctx.mpf(self.sinks[head])
        if keys.size == 0 and sink is None:
            return None
        qi = self.to_mp(q_row)
        s = [self.scale * ctx.fdot(qi, K[j]) for j in keys]
        if self.cap is not None:
            s = [self.cap * ctx.tanh(x / self.cap) for x in s]
        m = max(s + ([sink] if sink is not None else []))
        e = [ctx.exp(sj - m) for sj in s]
        total = ctx.fsum(e) + (ctx.exp(sink - m) if sink is not None else 0)
        out = [float(ctx.fdot(e, V[keys, c]) / total) for c in range(V.shape[1])]
        w = [float(ctx.fdot(e, [abs(x) for x in V[keys, c]]) / total) for c in range(V.shape[1])]
        return torch.tensor(out, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), float(m + ctx.log(total))
