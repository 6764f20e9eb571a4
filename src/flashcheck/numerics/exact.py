"""The mpmath oracle: attention with ``dps`` decimal digits, row by row, the auditor of the float64 one.

mpmath costs about 0.5 us per multiply-add and 3 us per exp at 50 digits, so it checks the float64
oracle (:func:`flashcheck.numerics.audit.audit_reference`) and is never the hot path. It computes the
same quantities as :func:`~flashcheck.numerics.oracle.reference_attention`, variants included: the cap with
mpmath's tanh, each bias feature's term converted exactly and summed in mpmath, the sink in each row's sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..contract.formats import FP64
from ..contract.validation import Shapes
from ..features.variant import Variant
from .answers import GRADIENTS, Gradients, Reference
from .blockwise import AttentionCall, visible_block
from .variant_gradients import Reductions

__all__ = ["mpmath_gradients", "mpmath_reference"]

U64 = FP64.unit_roundoff
SUBNORMAL = 2.0**-1074


# --- mpmath -----------------------------------------------------------------------------------------

def mpmath_reference(call: AttentionCall, row_index, dps: int) -> Reference:
    """The call's attention with ``dps`` digits on the query rows ``row_index`` (None: every row)."""
    q, shapes, variant = call.q, call.shapes, call.variant
    B, Hq, Nq, Dv = shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v
    rows_all = row_index if row_index is not None else torch.arange(Nq)
    R = rows_all.numel()
    out = torch.full((B, Hq, R, Dv), math.nan, dtype=torch.float64)
    w = torch.zeros_like(out)
    lse = torch.full((B, Hq, R), -math.inf, dtype=torch.float64)
    empty = torch.zeros((B, Hq, R), dtype=torch.bool)
    qd, kd, vd = (t.detach().cpu().to(torch.float64).numpy() for t in (q, call.k, call.v))
    row = _MpRow(mpmath_context(dps), call.scale, variant, shapes)
    visible = _visible(call, rows_all)
    visible = torch.broadcast_to(visible, (B * shapes.heads_kv, shapes.group, R, shapes.n_k)).numpy()
    for b in range(B):
        for kvh in range(shapes.heads_kv):
            K, V = row.to_mp(kd[b, kvh]), row.to_mp(vd[b, kvh])
            for h in range(kvh * shapes.group, (kvh + 1) * shapes.group):
                vis = visible[b * shapes.heads_kv + kvh, h - kvh * shapes.group]
                for r, i in enumerate(rows_all.tolist()):
                    result = row(qd[b, h, i], K, V, row.keys(vis[r], b, h, i), (b, h, i))
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


@dataclass
class _RowGradients:
    """One row's gradient shares in mpmath: dq, dS's size per key, dK and dV rows (mpmath), the weights,
    dS where the bias enters (per key) and the sink column's dS with its size."""

    dq: list
    size: object
    dk_rows: list
    dv_rows: list
    weights: object
    at_bias: list
    at_sink: float
    at_sink_size: float


class _MpRow:
    """One row of attention in mpmath: the variant's cap on the scaled logits, its bias, its sink in the sum.
    A row is named by ``at`` = (batch entry, query head, query index).

    Each bias feature's float64 term is exact (a float32 slope times a whole distance below 2^29 fits in 53
    bits), so mpmath sums the terms, each converted exactly; their float64 sum (``Variant.bias``) may round."""

    def __init__(self, ctx, scale, variant: Variant, shapes: Shapes):
        self.ctx, self.scale = ctx, ctx.mpf(scale)
        self.to_mp = np.frompyfunc(ctx.mpf, 1, 1)
        self.cap = None if variant.cap is None else ctx.mpf(variant.cap)
        self.sink_logits = None if variant.sink is None else [float(x) for x in variant.sink.tolist()]
        self.variant, self.shapes = variant, shapes
        full = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k)
        rows = torch.arange(shapes.n_q)
        self.biases = [np.broadcast_to(f.bias(variant, shapes.n_q, shapes.n_k, rows, "cpu", False).numpy(), full)
                       for f in variant.biasing()]

    def sink(self, head):
        logits = self.sink_logits
        return None if logits is None or logits[head] == -math.inf else self.ctx.mpf(logits[head])

    def keys(self, vis_row, b, h, i):
        """The visible keys of row (b, h, i): ``vis_row``'s, less those a -inf bias hides."""
        keys = np.flatnonzero(vis_row)
        for bias in self.biases:
            keys = keys[bias[b, h, i, keys] > -math.inf]
        return keys

    def bias(self, at, j):
        b, h, i = at
        out = self.ctx.mpf(0)
        for bias in self.biases:
            out += self.ctx.mpf(bias[b, h, i, j])
        return out

    def logits(self, raw, at, keys):
        """(the cap's input, the logits) of the row from its scaled logits: capped and biased in the
        variant's order (the cap's input is the scaled logits with the bias where it goes first)."""
        if self.biases:
            bias = [self.bias(at, j) for j in keys]
            if self.cap is not None and self.variant.bias_order == "cap_first":
                return raw, [self.cap * self.ctx.tanh(x / self.cap) + y for x, y in zip(raw, bias)]
            raw = [x + y for x, y in zip(raw, bias)]
        return raw, (raw if self.cap is None else [self.cap * self.ctx.tanh(x / self.cap) for x in raw])

    def weights(self, qi, K, keys, at):
        """(the cap's input, numerators, their max, total with the sink) of one row over ``keys``."""
        ctx, sink = self.ctx, self.sink(at[1])
        raw, s = self.logits([self.scale * ctx.fdot(qi, K[j]) for j in keys], at, keys)
        m = max(s + ([sink] if sink is not None else []))
        e = [ctx.exp(sj - m) for sj in s]
        sink_e = ctx.exp(sink - m) if sink is not None else 0
        return raw, e, m, ctx.fsum(e) + sink_e, sink_e

    def gradients(self, q_row, do_row, K, V, keys, at) -> "_RowGradients":
        """The gradients' shares of one row over ``keys``."""
        ctx = self.ctx
        qi, doi = self.to_mp(q_row), self.to_mp(do_row)
        raw, e, _, total, sink_e = self.weights(qi, K, keys, at)
        a = [x / total for x in e]
        dP = [ctx.fdot(doi, V[j]) for j in keys]
        Dsum = ctx.fsum(x * y for x, y in zip(a, dP))
        dS = dS_logit = [x * (y - Dsum) for x, y in zip(a, dP)]
        if self.cap is not None:  # back through the cap: its slope 1 - tanh^2
            dS = [d * (1 - ctx.tanh(r / self.cap) ** 2) for d, r in zip(dS, raw)]
        dq = [float(self.scale * ctx.fdot(dS, K[keys, d])) for d in range(K.shape[1])]
        a_f = np.array([float(x) for x in a])
        size = a_f * (np.abs([float(x) for x in dP]) + abs(float(Dsum)))  # dS's terms before they cancel
        at_bias = dS_logit if self.cap is not None and self.variant.bias_order == "cap_first" else dS
        return _RowGradients(dq, size, [(self.scale * x) * qi for x in dS], [x * doi for x in a], a_f,
                             [float(x) for x in at_bias], float(-sink_e / total * Dsum), float(sink_e / total * Dsum))

    def __call__(self, q_row, K, V, keys, at):
        """(out, w, lse) of the row over ``keys``, or None when nothing (no key, no sink) is visible."""
        ctx = self.ctx
        if keys.size == 0 and self.sink(at[1]) is None:
            return None
        _, e, m, total, _ = self.weights(self.to_mp(q_row), K, keys, at)
        out = [float(ctx.fdot(e, V[keys, c]) / total) for c in range(V.shape[1])]
        w = [float(ctx.fdot(e, [abs(x) for x in V[keys, c]]) / total) for c in range(V.shape[1])]
        return torch.tensor(out, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), float(m + ctx.log(total))


def mpmath_gradients(call: AttentionCall, do, forward: Reference) -> Gradients:
    """dQ, dK and dV with as many digits as ``forward`` (the call's mpmath forward) has, row by row (an
    auditor: small cases only), variants included."""
    q, scale, shapes, variant, dps = call.q, call.scale, call.shapes, call.variant, forward.dps
    ctx = mpmath_context(dps)
    row = _MpRow(ctx, scale, variant, shapes)
    qd, kd, vd, dod = (t.detach().cpu().to(torch.float64).numpy() for t in (q, call.k, call.v, do))
    visible = _visible(call, torch.arange(shapes.n_q))
    visible = torch.broadcast_to(visible, (shapes.batch * shapes.heads_kv, shapes.group, shapes.n_q,
                                           shapes.n_k)).numpy()
    grads = {"dq": np.zeros(qd.shape), "dk": np.zeros(kd.shape), "dv": np.zeros(vd.shape)}
    sizes = {n: np.zeros_like(g) for n, g in grads.items()}
    extra = Reductions(variant, shapes, "cpu", ("value", "abs", "scale"))
    for b in range(shapes.batch):
        for kvh in range(shapes.heads_kv):
            K, V = row.to_mp(kd[b, kvh]), row.to_mp(vd[b, kvh])
            dK, dV = np.full(K.shape, ctx.mpf(0), dtype=object), np.full(V.shape, ctx.mpf(0), dtype=object)
            for h in range(kvh * shapes.group, (kvh + 1) * shapes.group):
                vis = visible[b * shapes.heads_kv + kvh, h - kvh * shapes.group]
                for i in range(shapes.n_q):
                    keys = row.keys(vis[i], b, h, i)
                    if keys.size == 0:
                        continue  # no visible key: no weight, zero gradients
                    g = row.gradients(qd[b, h, i], dod[b, h, i], K, V, keys, (b, h, i))
                    grads["dq"][b, h, i] = g.dq
                    sizes["dq"][b, h, i] = abs(scale) * g.size @ np.abs(kd[b, kvh][keys])
                    for n, j in enumerate(keys):
                        dK[j] += g.dk_rows[n]
                        dV[j] += g.dv_rows[n]
                    sizes["dk"][b, kvh][keys] += abs(scale) * np.outer(g.size, np.abs(qd[b, h, i]))
                    sizes["dv"][b, kvh][keys] += np.outer(g.weights, np.abs(dod[b, h, i]))
                    _add_row(extra, (b * shapes.heads_kv + kvh, h - kvh * shapes.group, i), keys, g)
            grads["dk"][b, kvh] = np.vectorize(float, otypes=[np.float64])(dK)
            grads["dv"][b, kvh] = np.vectorize(float, otypes=[np.float64])(dV)
    # Each value carries the float64 rounding of a result accurate to about 10^-(dps-5) of its scale.
    digits = 10.0 ** (5 - dps)
    as_t = lambda x: torch.from_numpy(x).to(q.device)  # noqa: E731
    bound = {n: as_t(U64 * np.abs(grads[n]) + digits * sizes[n] + SUBNORMAL) for n in GRADIENTS}
    scales = {n: as_t(sizes[n]) for n in GRADIENTS}
    values = {}
    for n in extra.names:  # each row's share rounded to float64, then summed in float64
        values[n] = extra.reduced(n, "value").to(q.device)
        summed = (extra.terms(n) + 1) * U64 * extra.reduced(n, "abs") + digits * extra.reduced(n, "scale")
        bound[n], scales[n] = (summed + SUBNORMAL).to(q.device), extra.reduced(n, "scale").to(q.device)
    return Gradients(dq=as_t(grads["dq"]), dk=as_t(grads["dk"]), dv=as_t(grads["dv"]), bound=bound, scale=scales,
                     forward=forward, method="mpmath", dps=dps, shapes=shapes, **values)


def _visible(call: AttentionCall, rows):
    """The call's visibility of ``rows`` on the CPU, as the mpmath rows read it."""
    mask = None if call.attn_mask is None else call.attn_mask.cpu()
    return visible_block(call.causal, mask, call.shapes, rows, "cpu", variant=call.variant)


def _add_row(extra: Reductions, at: tuple, keys, g: _RowGradients) -> None:
    """One row's dS where the bias enters or its sink column, into each variant gradient's reductions
    (p, G, i)."""
    for name in extra.names:
        if extra.term(name) == "sink":
            for part, value in (("value", g.at_sink), ("abs", abs(g.at_sink)), ("scale", abs(g.at_sink_size))):
                extra.sums[name][part][at[:2]] += value
        else:
            dS = torch.tensor(g.at_bias, dtype=torch.float64)
            for part, value in (("value", dS), ("abs", dS.abs()), ("scale", torch.from_numpy(g.size))):
                extra.sums[name][part][at][torch.from_numpy(keys)] += value


def mpmath_context(dps: int):
    import mpmath  # on first use: the float64 oracle, the hot path, never loads mpmath

    ctx = mpmath.MPContext()
    ctx.dps = dps
    return ctx
