"""The mpmath oracle: attention with ``dps`` decimal digits, row by row, the auditor of the float64 one.

mpmath costs about 0.5 us per multiply-add and 3 us per exp at 50 digits, so it checks the float64
oracle (:func:`flashcheck.numerics.oracle.audit_reference`) and is never the hot path. It computes the
same quantities as :func:`~flashcheck.numerics.oracle.reference_attention`, variants included: the cap with
mpmath's tanh, the sink in each row's sum.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..contract.formats import FP64
from ..contract.validation import Shapes
from ..contract.variants import Variant
from .blockwise import visible_block

if TYPE_CHECKING:
    from .gradients import Gradients
    from .oracle import Reference

__all__ = ["mpmath_gradients", "mpmath_reference"]

U64 = FP64.unit_roundoff
SUBNORMAL = 2.0**-1074


# --- mpmath -----------------------------------------------------------------------------------------

def mpmath_reference(q, k, v, scale, causal, attn_mask, shapes: Shapes, row_index, dps, variant) -> "Reference":
    from .oracle import Reference

    B, Hq, Nq, Dv = shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v
    rows_all = row_index if row_index is not None else torch.arange(Nq)
    R = rows_all.numel()
    out = torch.full((B, Hq, R, Dv), math.nan, dtype=torch.float64)
    w = torch.zeros_like(out)
    lse = torch.full((B, Hq, R), -math.inf, dtype=torch.float64)
    empty = torch.zeros((B, Hq, R), dtype=torch.bool)
    qd, kd, vd = (t.detach().cpu().to(torch.float64).numpy() for t in (q, k, v))
    row = _MpRow(mpmath_context(dps), scale, variant)
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

    def sink(self, head):
        return None if self.sinks is None or self.sinks[head] == -math.inf else self.ctx.mpf(self.sinks[head])

    def weights(self, qi, K, keys, head):
        """(raw logits, numerators, their max, total with the sink) of one row over ``keys``."""
        ctx, sink = self.ctx, self.sink(head)
        raw = [self.scale * ctx.fdot(qi, K[j]) for j in keys]
        s = raw if self.cap is None else [self.cap * ctx.tanh(x / self.cap) for x in raw]
        m = max(s + ([sink] if sink is not None else []))
        e = [ctx.exp(sj - m) for sj in s]
        return raw, e, m, ctx.fsum(e) + (ctx.exp(sink - m) if sink is not None else 0)

    def gradients(self, q_row, do_row, K, V, keys, head):
        """(dq row, dS's size per key, dK rows, dV rows, weights as floats) of one row over ``keys``."""
        ctx = self.ctx
        qi, doi = self.to_mp(q_row), self.to_mp(do_row)
        raw, e, _, total = self.weights(qi, K, keys, head)
        a = [x / total for x in e]
        dP = [ctx.fdot(doi, V[j]) for j in keys]
        Dsum = ctx.fsum(x * y for x, y in zip(a, dP))
        dS = [x * (y - Dsum) for x, y in zip(a, dP)]
        if self.cap is not None:  # back through the cap: its slope 1 - tanh^2
            dS = [d * (1 - ctx.tanh(r / self.cap) ** 2) for d, r in zip(dS, raw)]
        dq = [float(self.scale * ctx.fdot(dS, K[keys, d])) for d in range(K.shape[1])]
        a_f = np.array([float(x) for x in a])
        size = a_f * (np.abs([float(x) for x in dP]) + abs(float(Dsum)))  # dS's terms before they cancel
        return dq, size, [(self.scale * x) * qi for x in dS], [x * doi for x in a], a_f

    def __call__(self, q_row, K, V, keys, head):
        """(out, w, lse) of the row over ``keys``, or None when nothing (no key, no sink) is visible."""
        ctx = self.ctx
        if keys.size == 0 and self.sink(head) is None:
            return None
        _, e, m, total = self.weights(self.to_mp(q_row), K, keys, head)
        out = [float(ctx.fdot(e, V[keys, c]) / total) for c in range(V.shape[1])]
        w = [float(ctx.fdot(e, [abs(x) for x in V[keys, c]]) / total) for c in range(V.shape[1])]
        return torch.tensor(out, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), float(m + ctx.log(total))


def mpmath_gradients(q, k, v, do, scale, causal, attn_mask, shapes: Shapes, dps: int, variant) -> "Gradients":
    """dQ, dK and dV with ``dps`` digits, row by row (an auditor: small cases only), variants included."""
    from .gradients import GRADIENTS, Gradients
    from .oracle import reference_attention

    ctx = mpmath_context(dps)
    row = _MpRow(ctx, scale, variant)
    qd, kd, vd, dod = (t.detach().cpu().to(torch.float64).numpy() for t in (q, k, v, do))
    visible = visible_block(causal, None if attn_mask is None else attn_mask.cpu(), shapes, torch.arange(shapes.n_q),
                            "cpu", variant=variant)
    visible = torch.broadcast_to(visible, (shapes.batch * shapes.heads_kv, shapes.group, shapes.n_q,
                                           shapes.n_k)).numpy()
    grads = {"dq": np.zeros(qd.shape), "dk": np.zeros(kd.shape), "dv": np.zeros(vd.shape)}
    sizes = {n: np.zeros_like(g) for n, g in grads.items()}
    for b in range(shapes.batch):
        for kvh in range(shapes.heads_kv):
            K, V = row.to_mp(kd[b, kvh]), row.to_mp(vd[b, kvh])
            dK, dV = np.full(K.shape, ctx.mpf(0), dtype=object), np.full(V.shape, ctx.mpf(0), dtype=object)
            for h in range(kvh * shapes.group, (kvh + 1) * shapes.group):
                vis = visible[b * shapes.heads_kv + kvh, h - kvh * shapes.group]
                for i in range(shapes.n_q):
                    keys = np.flatnonzero(vis[i])
                    if keys.size == 0:
                        continue  # no visible key: no weight, zero gradients
                    found = row.gradients(qd[b, h, i], dod[b, h, i], K, V, keys, h)
                    dq_row, size, dk_rows, dv_rows, a_f = found
                    grads["dq"][b, h, i] = dq_row
                    sizes["dq"][b, h, i] = abs(scale) * size @ np.abs(kd[b, kvh][keys])
                    for n, j in enumerate(keys):
                        dK[j] += dk_rows[n]
                        dV[j] += dv_rows[n]
                    sizes["dk"][b, kvh][keys] += abs(scale) * np.outer(size, np.abs(qd[b, h, i]))
                    sizes["dv"][b, kvh][keys] += np.outer(a_f, np.abs(dod[b, h, i]))
            grads["dk"][b, kvh] = np.vectorize(float, otypes=[np.float64])(dK)
            grads["dv"][b, kvh] = np.vectorize(float, otypes=[np.float64])(dV)
    # Each value carries the float64 rounding of a result accurate to about 10^-(dps-5) of its scale.
    digits = 10.0 ** (5 - dps)
    as_t = lambda x: torch.from_numpy(x).to(q.device)  # noqa: E731
    bound = {n: as_t(U64 * np.abs(grads[n]) + digits * sizes[n] + SUBNORMAL) for n in GRADIENTS}
    forward = reference_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, method="mpmath",
                                  dps=dps, variant=variant)
    return Gradients(dq=as_t(grads["dq"]), dk=as_t(grads["dk"]), dv=as_t(grads["dv"]), bound=bound,
                     scale={n: as_t(sizes[n]) for n in GRADIENTS}, forward=forward, method="mpmath", dps=dps,
                     shapes=shapes)


def mpmath_context(dps: int):
    import mpmath

    ctx = mpmath.MPContext()
    ctx.dps = dps
    return ctx
