"""``torch:split-kv``: split-KV decoding over a paged cache, with its own merge of the partial states.

Each sequence's keys are cut into ``num_splits`` contiguous ranges (some empty when there are more splits
than keys); each range gives a partial state (o_s, lse_s) in fp32, an empty one (0, -inf); the states are
merged relative to the largest lse and rounded once. This is the algorithm of flash-decoding and of vLLM's
and FlashInfer's split kernels. Its planted bugs (:mod:`flashcheck.kernels.planted`) are the merge defects users
reported.
"""

from __future__ import annotations

import math

import torch

from ..contract.spec import Kernel, KernelSpec

__all__ = ["SPLIT_COUNTS", "make_split_kv_kernel"]

# Split counts every case is judged at: one split, a few, and more splits than many sequences have keys.
SPLIT_COUNTS = (1, 2, 3, 16, 32)


def _partial(q, keys, values, visible, scale, mutant):
    """The fp32 partial state (o (Hq, Nq, Dv), lse (Hq, Nq)) of one split: its keys (m, Hq, D), a bool
    (Nq, m) of the keys each query may see."""
    s = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) * scale
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1) if s.shape[-1] else s.new_full(s.shape[:-1], -math.inf)
    safe = torch.where(lse == -math.inf, 0.0, lse)
    p = torch.exp(s - safe[..., None])
    total = p.sum(-1, keepdim=True)
    if mutant == "empty_split_nan":
        o = (p @ values.float().transpose(0, 1)) / total
    else:
        o = torch.where(total > 0, (p @ values.float().transpose(0, 1)) / total.clamp_min(1e-38), 0.0)
    return o, lse / math.log(2) if mutant == "lse_base2" else lse


def _merge(outs, lses):
    m = lses.amax(0)
    safe = torch.where(m == -math.inf, 0.0, m)
    w = torch.exp(lses - safe)
    total = w.sum(0)
    out = (w[..., None] * outs).sum(0) / torch.where(total > 0, total, 1.0)[..., None]
    return out, torch.where(total > 0, safe + torch.log(total), -math.inf)


def _sequence(q, keys, values, *, scale, causal, splits, mutant):
    """One sequence's merged (out (Nq, Hq, Dv) fp32, lse (Hq, Nq))."""
    n_q, n = q.shape[0], keys.shape[0]
    group = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    i = torch.arange(n_q, device=q.device).view(-1, 1)
    j = torch.arange(n, device=q.device).view(1, -1)
    visible = j <= i + (n - n_q) if causal == "bottom_right" else torch.ones(n_q, n, dtype=torch.bool,
                                                                              device=q.device)
    edges = [n * s // splits for s in range(splits + 1)]
    states = [_partial(q, keys[a:b], values[a:b], visible[:, a:b], scale, mutant) for a, b in zip(edges, edges[1:])]
    out, lse = _merge(torch.stack([o for o, _ in states]), torch.stack([lse for _, lse in states]))
    return out.transpose(0, 1), lse


def make_split_kv_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    def attention(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
        page = k_cache.shape[1]
        out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        for b, n in enumerate(cache_seqlens.tolist()):
            j = torch.arange(n, device=q.device)
            physical = block_table[b].long()[j // page]
            o, lse[b] = _sequence(q[b], k_cache[physical, j % page], v_cache[physical, j % page], scale=scale,
                                  causal=causal, splits=num_splits, mutant=mutant)
            out[b] = o.to(q.dtype)
        return out, lse

    spec = KernelSpec(form="paged", causal=("none", "bottom_right"), gqa=True, dv_equals_d=False,
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=True,
                      nan_safe_masking=True, num_splits=SPLIT_COUNTS)
    name = "torch:split-kv" + (f"~{mutant}" if mutant else "")
    attention.__name__ = attention.__qualname__ = "split_kv"
    return Kernel(attention, spec, name=name)
