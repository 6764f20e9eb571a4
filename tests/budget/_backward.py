"""A FA2-style attention backward in torch, written as the kernels compute it (P recomputed in fp32
from the saved lse, P and dS rounded to the inputs' dtype before their matmuls, D from the rounded O,
fp32 accumulation), with switches that plant the backward bugs users report."""

from __future__ import annotations

import math

import torch

from flashcheck.contract.masks import causal as causal_fn

BUGS = ("d_missing", "scale_missing_in_dq", "p_not_masked", "lse_log2_units", "ds_in_fp32_to_bf16",
        "gqa_not_summed")


def fa2_backward(q, k, v, do, *, scale, causal="none", attn_mask=None, bug=None):
    """(dq, dk, dv) in the inputs' dtype, from a forward computed the same way (its O rounded)."""
    dtype = q.dtype
    B, Hq, Nq, D = q.shape
    Hkv, Nk = k.shape[1], k.shape[2]
    G = Hq // Hkv
    K, V = (t.float().repeat_interleave(G, 1) for t in (k, v))
    Q, dO = q.float(), do.float()
    vis = causal_fn(causal, Nq, Nk)(0, 0, torch.arange(Nq).view(-1, 1), torch.arange(Nk).view(1, -1))
    vis = torch.broadcast_to(vis, (B, Hq, Nq, Nk))
    if attn_mask is not None:
        vis = vis & torch.broadcast_to(attn_mask, (B, Hq, Nq, Nk))
    s = (Q @ K.transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, -math.inf)
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    lse = m + torch.log(l)  # -inf on rows with no visible key
    out = ((p.to(dtype).float() @ V) / l).nan_to_num(0.0).to(dtype)  # the forward's rounded O
    saved = lse / math.log(2) if bug == "lse_log2_units" else lse
    s_bw = (Q @ K.transpose(-1, -2)) * scale
    if bug != "p_not_masked":
        s_bw = s_bw.masked_fill(~vis, -math.inf)
    P = torch.exp(s_bw - saved).nan_to_num(0.0)
    P = torch.where(torch.isfinite(saved), P, torch.zeros_like(P))
    dV = P.to(dtype).float().transpose(-1, -2) @ dO
    dP = dO @ V.transpose(-1, -2)
    Di = (dO * out.float()).sum(-1, keepdim=True)
    if bug == "d_missing":
        Di = torch.zeros_like(Di)
    dS = P * (dP - Di)
    dS_t = dS.to(torch.bfloat16).float() if bug == "ds_in_fp32_to_bf16" else dS.to(dtype).float()
    dQ = (dS_t @ K) * (1.0 if bug == "scale_missing_in_dq" else scale)
    dK = (dS_t.transpose(-1, -2) @ Q) * scale
    if bug == "gqa_not_summed":
        dK, dV = dK[:, ::G], dV[:, ::G]  # the group's first head only
    else:
        dK, dV = (t.reshape(B, Hkv, G, Nk, -1).sum(2) for t in (dK, dV))
    return dQ.to(dtype), dK.to(dtype), dV.to(dtype)
