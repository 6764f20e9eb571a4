"""Plain-callable attention kernels of the two sparse conventions the reproducer writes last, each with a planted bug
and its fixed twin, fp32 throughout, the output rounded once; they import nothing of flashcheck:

- key-block lists in FlexAttention's layout, blocks of 4 x 4, trusted full blocks attended whole (causal alignment
  and mask skipped there); the bug reads one entry past each row's count;
- index sets whose repeated keys count as often as listed (duplicates='twice', a gather of every entry); the bug
  counts a repeated key once."""

import math

import torch

BLOCK = 4


def _block_table(num, idx, kv_blocks, past_count):
    used = torch.arange(idx.shape[-1]) < num[..., None] + past_count  # past_count 1: the planted bug
    used = used & (idx >= 0) & (idx < kv_blocks)
    table = torch.zeros((*idx.shape[:3], kv_blocks), dtype=torch.int32)
    return table.scatter_add_(-1, torch.where(used, idx, 0).long(), used.to(torch.int32)) > 0


def _keys(table, n_q, n_k):
    return table.repeat_interleave(BLOCK, 2)[:, :, :n_q].repeat_interleave(BLOCK, 3)[..., :n_k]


def _softmax_attention(q, k, v, scale, weight):
    """``weight``: how often each key counts (B, 1 or Hq, Nq, Nk), 0 where it is not seen; empty rows give 0."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    s = ((q.float() @ k.transpose(-1, -2)) * scale).masked_fill(weight == 0, -math.inf)
    m = s.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0)
    p = torch.exp(s - m) * weight
    total = p.sum(-1, keepdim=True)
    return (p @ v / torch.where(total == 0, 1.0, total)).to(q.dtype)


def _causal(causal, n_q, n_k):
    keep = torch.ones(n_q, n_k, dtype=torch.bool)
    return keep.tril(0) if causal == "top_left" else keep.tril(n_k - n_q) if causal == "bottom_right" else keep


def _blocks(q, k, v, *, scale, causal, attn_mask, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices,
            past_count):
    n_q, n_k = q.shape[2], k.shape[2]
    kv_blocks = -(-n_k // BLOCK)
    seen = _keys(_block_table(kv_num_blocks, kv_indices, kv_blocks, past_count), n_q, n_k) & _causal(causal, n_q, n_k)
    if attn_mask is not None:
        seen = seen & attn_mask
    if full_kv_num_blocks is not None:  # trusted: attended whole
        seen = seen | _keys(_block_table(full_kv_num_blocks, full_kv_indices, kv_blocks, 0), n_q, n_k)
    return _softmax_attention(q, k, v, scale, seen.to(torch.float32))


def blocks_fixed(q, k, v, *, scale, causal, attn_mask=None, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                 full_kv_indices=None):
    return _blocks(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, kv_num_blocks=kv_num_blocks,
                   kv_indices=kv_indices, full_kv_num_blocks=full_kv_num_blocks, full_kv_indices=full_kv_indices,
                   past_count=0)


def blocks_past_count(q, k, v, *, scale, causal, attn_mask=None, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
                      full_kv_indices=None):
    return _blocks(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, kv_num_blocks=kv_num_blocks,
                   kv_indices=kv_indices, full_kv_num_blocks=full_kv_num_blocks, full_kv_indices=full_kv_indices,
                   past_count=1)


def _gather(q, k, v, *, scale, causal, attn_mask, indices, once):
    n_q, n_k = q.shape[2], k.shape[2]
    listed = indices.long()
    valid = (listed >= 0) & (listed < n_k)
    counts = torch.zeros((*listed.shape[:-1], n_k), dtype=torch.float32)
    counts = counts.scatter_add_(-1, listed.clamp(0, n_k - 1), valid.to(torch.float32))
    if once:  # the planted bug: a repeated key counts once
        counts = (counts > 0).to(torch.float32)
    seen = _causal(causal, n_q, n_k) if attn_mask is None else _causal(causal, n_q, n_k) & attn_mask
    return _softmax_attention(q, k, v, scale, counts * seen)


def twice_fixed(q, k, v, *, scale, causal, attn_mask=None, indices):
    return _gather(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, indices=indices, once=False)


def twice_counted_once(q, k, v, *, scale, causal, attn_mask=None, indices):
    return _gather(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, indices=indices, once=True)
