"""Plain-callable kernels of the serving forms with planted bugs, and their fixed twins, for the reproducer tests:
the defects of flashcheck's torch:varlen~reads_past_end, torch:paged~page_off_by_one and
torch:split-kv~empty_split_nan, written with torch alone (a reproducer runs where flashcheck is not installed).
Each sequence is attended in fp32 and its output rounded once."""

import torch


def _attend(q, k, v, *, scale, causal):
    """One sequence: q (Nq, Hq, D), k and v (Nk, Hkv, D) -> out (Nq, Hq, Dv) fp32, 0 on a row without keys, and
    its lse (Hq, Nq)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    if causal == "bottom_right":
        n_q, n_k = q.shape[0], k.shape[0]
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q), -torch.inf)
    return _normalised(s, v)


def _normalised(s, v, *, nan_when_empty=False):
    lse = torch.logsumexp(s, -1) if s.shape[-1] else s.new_full(s.shape[:-1], -torch.inf)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])
    total = p.sum(-1)
    if not nan_when_empty:
        total = torch.where(total > 0, total, 1.0)
    return torch.einsum("hqk,khd->qhd", p, v) / total.transpose(0, 1)[..., None], lse


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, scale, causal, past_end):
    cu_q, cu_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    for b in range(len(cu_q) - 1):
        keys = slice(cu_k[b], cu_k[b + 1] + past_end)  # past_end: the first key of the next span too
        o, _ = _attend(q[cu_q[b]:cu_q[b + 1]], k[keys], v[keys], scale=scale, causal=causal)
        out[cu_q[b]:cu_q[b + 1]] = o.to(q.dtype)
    return out


def _paged(q, k_cache, v_cache, block_table, cache_seqlens, *, scale, causal, off_by_one):
    page = k_cache.shape[1]
    out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])
    for b, n in enumerate(cache_seqlens.tolist()):
        j = torch.arange(n)
        pages = (j - 1).clamp_min(0) // page if off_by_one else j // page  # the page before, at each page start
        physical = block_table[b].long()[pages]
        out[b] = _attend(q[b], k_cache[physical, j % page], v_cache[physical, j % page], scale=scale,
                         causal=causal)[0].to(q.dtype)
    return out


def _split_kv(q, k_cache, v_cache, block_table, cache_seqlens, *, scale, causal, num_splits, nan_when_empty):
    page, group = k_cache.shape[1], q.shape[2] // k_cache.shape[2]
    out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])
    lse = torch.empty(q.shape[0], q.shape[2], q.shape[1])
    for b, n in enumerate(cache_seqlens.tolist()):
        j = torch.arange(n)
        physical = block_table[b].long()[j // page]
        keys, values = (c[physical, j % page].repeat_interleave(group, 1).float() for c in (k_cache, v_cache))
        s = torch.einsum("qhd,khd->hqk", q[b].float(), keys) * scale
        if causal == "bottom_right":
            s = s.masked_fill(~torch.ones(q.shape[1], n, dtype=torch.bool).tril(n - q.shape[1]), -torch.inf)
        edges = [n * i // num_splits for i in range(num_splits + 1)]
        parts = [_normalised(s[..., lo:hi], values[lo:hi], nan_when_empty=nan_when_empty)
                 for lo, hi in zip(edges, edges[1:])]
        outs, lses = torch.stack([o for o, _ in parts]), torch.stack([m for _, m in parts])
        top = lses.amax(0)
        w = torch.exp(lses - torch.where(torch.isfinite(top), top, 0.0))  # 0 for an empty split
        total = w.sum(0)
        merged = (w.transpose(1, 2)[..., None] * outs).sum(0) / torch.where(total > 0, total, 1.0).T[..., None]
        out[b], lse[b] = merged.to(q.dtype), torch.where(total > 0, top + torch.log(total), -torch.inf)
    return out, lse


def varlen_fixed(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=causal, past_end=0)


def varlen_reads_past_end(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """Each sequence also attends the key just past its end."""
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=scale, causal=causal, past_end=1)


def paged_fixed(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none"):
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, scale=scale, causal=causal, off_by_one=False)


def paged_page_off_by_one(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none"):
    """The first key of every page after the first is read from the page before."""
    return _paged(q, k_cache, v_cache, block_table, cache_seqlens, scale=scale, causal=causal, off_by_one=True)


def split_kv_fixed(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
    return _split_kv(q, k_cache, v_cache, block_table, cache_seqlens, scale=scale, causal=causal,
                     num_splits=num_splits, nan_when_empty=False)


def split_kv_empty_split_nan(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
    """An empty split's partial output is 0 / 0 = NaN, and the merge multiplies it by its weight 0."""
    return _split_kv(q, k_cache, v_cache, block_table, cache_seqlens, scale=scale, causal=causal,
                     num_splits=num_splits, nan_when_empty=True)
