"""A plain-callable sparse (index-set) attention kernel with a planted bug, and its fixed twin, for the reproducer
tests: each query attends the keys its list names (-1 padding; a repeated key counts once), fp32 throughout, the
output rounded once. They import nothing of flashcheck."""

import torch


def _attention(q, k, v, *, scale, causal, attn_mask, indices, padding_reads_key_0):
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1).float(), v.repeat_interleave(group, 1).float()
    n_q, n_k = q.shape[2], k.shape[2]
    listed = indices.long()
    valid = (listed >= 0) & (listed < n_k)
    if padding_reads_key_0:  # the planted bug: -1 is read as key 0
        valid, listed = valid | (listed == -1), listed.clamp(min=0)
    counts = torch.zeros((*listed.shape[:-1], n_k), dtype=torch.int32)
    visible = counts.scatter_add_(-1, listed.clamp(0, n_k - 1), valid.to(torch.int32)) > 0
    visible = visible.repeat_interleave(q.shape[1] // visible.shape[1], 1) if visible.shape[1] > 1 else visible
    if causal == "bottom_right":
        visible = visible & torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    if attn_mask is not None:
        visible = visible & attn_mask
    s = (q.float() @ k.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~visible, -torch.inf), -1).nan_to_num(0.0)  # empty rows: 0
    return (p @ v).to(q.dtype)


def sparse_fixed(q, k, v, *, scale, causal, attn_mask=None, indices):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, indices=indices,
                      padding_reads_key_0=False)


def sparse_padding_as_key_0(q, k, v, *, scale, causal, attn_mask=None, indices):
    return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, indices=indices,
                      padding_reads_key_0=True)
