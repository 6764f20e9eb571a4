"""Merges of partial attention states with planted bugs, and their fixed twins, for the reproducer tests: two-state
merges (FlashInfer's merge_state convention) and S-state ones, written with torch alone."""

import math

import torch


def pair_fixed(a, la, b, lb, *, exp=torch.exp, log=torch.log):
    """FlashInfer's and vLLM's two-state merge: weights relative to the larger lse in fp32, the out rounded once
    (``exp`` and ``log`` of the lse's base)."""
    m = torch.maximum(la, lb)
    safe = torch.where(m == -math.inf, 0.0, m)
    wa, wb = exp(la - safe), exp(lb - safe)
    total = wa + wb
    out = (wa[:, None] * a.float() + wb[:, None] * b.float()) / torch.where(total > 0, total, 1.0)[:, None]
    return out.to(a.dtype), torch.where(total > 0, safe + log(total), -math.inf)


def pair_lse_not_updated(a, la, b, lb):
    """The merged lse is the first state's."""
    return pair_fixed(a, la, b, lb)[0], la


def states_fixed(outs, lses):
    m = lses.amax(0)
    safe = torch.where(m == -math.inf, 0.0, m)
    w = torch.exp(lses - safe)
    total = w.sum(0)
    out = (w[..., None] * outs.float()).sum(0) / torch.where(total > 0, total, 1.0)[..., None]
    return out.to(outs.dtype), torch.where(total > 0, safe + torch.log(total), -math.inf)


def states_nan_on_empty(outs, lses):
    """No guard: a row whose states are all empty gives e^(-inf - -inf) = NaN."""
    m = lses.amax(0)
    w = torch.exp(lses - m)
    return ((w[..., None] * outs.float()).sum(0) / w.sum(0)[..., None]).to(outs.dtype), m + torch.log(w.sum(0))
