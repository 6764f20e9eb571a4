"""``torch:block-sparse``: attention over key-block lists (:mod:`flashcheck.contract.block_sparse`) in float32 torch,
the reference of the convention.

``kernel(q, k, v, *, scale, causal, attn_mask=None, kv_num_blocks, kv_indices, full_kv_num_blocks=None,
full_kv_indices=None)``: query block i attends the first ``kv_num_blocks[b, h, i]`` blocks of its ``kv_indices`` row
under the causal alignment and the mask, and its full blocks likewise (``full_blocks="masked"``) or whole
(``"trusted"``, the option ``full_blocks``). It reads the lists entry by entry into the keys each query block may
see, then takes a masked softmax in fp32, rounded once to the input's dtype. Its planted bugs
(:data:`flashcheck.kernels.planted.BLOCK_SPARSE`) are the misreads of block lists users reported.
"""

from __future__ import annotations

import math

import torch

from ..contract.block_sparse import FULL_BLOCKS, BlockSparse
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, InvalidArgument
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["make_block_sparse_kernel"]

_NEG_INF = -math.inf
Q_BLOCK, KV_BLOCK = 16, 32  # small blocks: a short case spans several of each


def _blocks(num, idx, n_blocks: int, mutant: str | None) -> torch.Tensor:
    """(B, H, Q_blocks, KV_blocks) bool of the blocks the lists name, reading ``num`` entries of each row (one more
    for the planted off-by-one)."""
    extra = 1 if mutant == "count_off_by_one" else 0
    read = torch.arange(idx.shape[-1], device=idx.device) < (num[..., None] + extra)
    valid = read & (idx >= 0) & (idx < n_blocks)
    table = torch.zeros((*idx.shape[:3], n_blocks), dtype=torch.int32, device=idx.device)
    return table.scatter_add_(-1, torch.where(valid, idx, 0).long(), valid.to(torch.int32)) > 0


def _keys(table, q_block: int, kv_block: int, n_q: int, n_k: int) -> torch.Tensor:
    """The block table spread over (Nq, Nk) positions."""
    return table.repeat_interleave(q_block, 2)[:, :, :n_q].repeat_interleave(kv_block, 3)[..., :n_k]


def _base(causal: str, attn_mask, n_q: int, n_k: int, device) -> torch.Tensor:
    i = torch.arange(n_q, device=device).view(-1, 1)
    j = torch.arange(n_k, device=device).view(1, -1)
    vis = {"bottom_right": j <= i + (n_k - n_q), "top_left": j <= i}.get(causal, torch.ones_like(i - j, dtype=torch.bool))
    vis = vis.view(1, 1, n_q, n_k)
    return vis if attn_mask is None else vis & attn_mask.to(device)


def _visible(lists: dict, causal, attn_mask, shape, *, trusted: bool, mutant: str | None) -> torch.Tensor:
    B, H, n_q, n_k = shape
    n_blocks = math.ceil(n_k / KV_BLOCK)
    pad = n_blocks * KV_BLOCK if mutant == "tail_block_padded" else n_k
    listed = _keys(_blocks(lists["kv_num_blocks"], lists["kv_indices"], n_blocks, mutant), Q_BLOCK, KV_BLOCK, n_q, pad)
    base = _base(causal, attn_mask, n_q, n_k, listed.device)
    if pad > n_k:  # the tail block's missing keys attended as zero keys: under the base of the last key
        base = torch.cat([base.expand(-1, -1, -1, n_k), base[..., -1:].expand(-1, -1, -1, pad - n_k)], -1)
    vis = listed if mutant == "partial_as_full" else listed & base
    if lists.get("full_kv_num_blocks") is not None:
        full = _keys(_blocks(lists["full_kv_num_blocks"], lists["full_kv_indices"], n_blocks, None), Q_BLOCK,
                     KV_BLOCK, n_q, pad)
        vis = vis | (full if trusted or mutant == "full_list_trusted" else full & base)
    return torch.broadcast_to(vis, (B, H, n_q, pad))


def _attend(q, k, v, lists, *, scale, causal, attn_mask, trusted, mutant):
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, 1) for t in (k, v))
    vis = _visible(lists, causal, attn_mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), trusted=trusted,
                   mutant=mutant)
    if vis.shape[-1] > k.shape[2]:  # the padded tail: zero keys and values
        pad = vis.shape[-1] - k.shape[2]
        k, v = (torch.cat([t, t.new_zeros(*t.shape[:2], pad, t.shape[3])], 2) for t in (k, v))
    s = (q.float() @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~vis, _NEG_INF)
    m = s.amax(-1)
    m = torch.where(m == _NEG_INF, 0.0, m)  # a row with no visible key: p = 0, out = 0, lse = -inf
    p = torch.exp(s - m[..., None])
    total = p.sum(-1)
    out = (p @ v) / torch.where(total > 0, total, 1.0)[..., None]
    return out.to(q.dtype), m + torch.log(total)


def make_block_sparse_kernel(*, device: str, mutant: str | None = None, full_blocks: str = "masked") -> Kernel:
    """``torch:block-sparse`` (blocks of 16 x 32) with its full-block convention and its planted bug ``mutant`` (a
    name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("torch:block-sparse", "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if full_blocks not in FULL_BLOCKS[1:]:
        raise InvalidArgument("full_blocks", full_blocks, "unknown convention", "Use 'masked' or 'trusted'.")
    spec = KernelSpec(block_sparse=BlockSparse(Q_BLOCK, KV_BLOCK, full_blocks),
                      causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
                      fully_masked_rows="zero", precision="upcast", devices=(device,), max_head_dim=256,
                      backward=True, nan_safe_masking=False)  # a masked key's V is read: 0 * NaN

    def block_sparse(q, k, v, *, scale, causal="none", attn_mask=None, **lists):
        return _attend(q, k, v, lists, scale=scale, causal=causal, attn_mask=attn_mask,
                       trusted=full_blocks == "trusted", mutant=mutant)

    options = "" if full_blocks == "masked" else f"[full_blocks={full_blocks}]"
    name = f"torch:block-sparse{options}"
    return Kernel(block_sparse, spec, name=f"{name}~{mutant}" if mutant else name)
