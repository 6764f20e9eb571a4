"""The backward's defect models: dQ, dK and dV as an FA2-style backward computes them in fp32 from the recomputed
P, with one mistake at a named point (:class:`GradientDefect`; none: the legal twin of the backward).

Per query head: S = scale Q K^T, P = exp(S - lse), O = P V rounded to the input dtype (the kernel's own forward
output, which D reads), D = rowsum(dO * O), dP = dO V^T, dS = P (dP - D), dQ = scale dS K, and each query head's
shares dK = scale dS^T Q and dV = P^T dO, summed over its K/V head's group. Cases with a bias, a cap, a sink or
quantized inputs are outside these models (:func:`covers`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..contract.masks import visible
from ..numerics.twin import round_tf32

__all__ = ["GradientDefect", "contract_p_rounding", "covers", "model_gradients"]


@dataclass(frozen=True)
class GradientDefect:
    """One mistake of a backward: ``ds`` rounds dS, ``scaled_ds`` rounds scale x dS, ``p_for_ds`` and ``p_for_dv``
    round P where dS and dV read it (``p_for_dv`` in place of the contract's rounding), ``dv_acc`` rounds dV's
    accumulator after each tile of ``block_m`` query rows, ``share`` rounds each query head's dK and dV share
    before the group's sum, or (``running``) the group's running sum after each head."""

    ds: Callable | None = None
    scaled_ds: Callable | None = None
    p_for_ds: Callable | None = None
    p_for_dv: Callable | None = None
    dv_acc: Callable | None = None
    block_m: int = 64
    share: Callable | None = None
    running: bool = False


def covers(case) -> bool:
    """Whether the backward's models describe ``case``: no bias, cap, sink or quantized inputs."""
    variant = case.variant
    return variant is None or not (variant.biased or variant.capped or variant.sink is not None or variant.quantized)


def model_gradients(case, do, *, p_rounding: Callable | None, defect: GradientDefect = GradientDefect(),
                    device="cpu"):
    """(dQ, dK, dV) of ``case`` for the upstream gradient ``do`` with ``defect``'s mistake, in the input dtype;
    ``p_rounding`` is the contract's rounding of P before dV (None: fp32)."""
    s = case.shapes
    dtype = case.torch_dtype
    group = s.heads_q // s.heads_kv
    q, k, v, do = (t.to(device).float() for t in (case.q, case.k, case.v, do))
    k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    vis = visible(case.causal, mask, (s.batch, s.heads_q, s.n_q, s.n_k), device=device, variant=case.variant)
    scores = torch.where(vis, case.scale * (q @ k.transpose(-1, -2)), -math.inf)
    m = scores.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(scores - m)
    p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    out = (p @ v).to(dtype).float()
    dp = do @ v.transpose(-1, -2)
    delta = (do * out).sum(-1, keepdim=True)
    ds = (p if defect.p_for_ds is None else defect.p_for_ds(p)) * (dp - delta)
    ds = ds if defect.ds is None else defect.ds(ds)
    scaled = case.scale * ds
    scaled = scaled if defect.scaled_ds is None else defect.scaled_ds(scaled)
    dq = scaled @ k
    dk = scaled.transpose(-1, -2) @ q
    p_dv = defect.p_for_dv or p_rounding
    dv = _dv(p if p_dv is None else p_dv(p), do, defect)
    dk, dv = (_group_sum(t, s.heads_kv, defect) for t in (dk, dv))
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


def _dv(p, do, defect: GradientDefect):
    """P^T dO, over tiles of query rows rounded after each where the defect rounds the accumulator."""
    if defect.dv_acc is None:
        return p.transpose(-1, -2) @ do
    acc = torch.zeros(*p.shape[:2], p.shape[-1], do.shape[-1], device=p.device)
    for r0 in range(0, p.shape[2], defect.block_m):
        rows = slice(r0, r0 + defect.block_m)
        acc = defect.dv_acc(acc + p[:, :, rows].transpose(-1, -2) @ do[:, :, rows])
    return acc


def _group_sum(shares, heads_kv: int, defect: GradientDefect):
    """Each K/V head's sum of its query heads' shares (B, Hq, Nk, D) -> (B, Hkv, Nk, D): each share rounded first,
    or the running sum rounded after each head, where the defect says."""
    grouped = shares.unflatten(1, (heads_kv, -1))
    if defect.share is None:
        return grouped.sum(2)
    if not defect.running:
        return defect.share(grouped).sum(2)
    total = torch.zeros_like(grouped[:, :, 0])
    for g in range(grouped.shape[2]):
        total = defect.share(total + grouped[:, :, g])
    return total


def contract_p_rounding(precision, dtype: torch.dtype):
    """The contract's rounding of P before P^T dO (None: it stays in fp32)."""
    if precision.p_dtype != "input":
        return None
    if dtype == torch.float32:
        return round_tf32 if precision.tf32 else None
    return lambda p: p.to(dtype).float()

