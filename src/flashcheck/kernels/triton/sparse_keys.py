"""What ``flashcheck:triton-sparse``'s forward and backward kernels share: how a tile of a row's index list is
read (:func:`listed_keys`), which (query head, key) pairs of it are visible (:func:`visible_keys`), and the host's
record of a call (:class:`SparseArgs`: the checked inputs, their strides, the tile sizes).

The layout is FlashMLA's sparse one: a program holds one query row of one batch entry and a block of the query
heads that share a K/V head, since those heads share the row's list (``indices`` is per K/V head or one for all).
Its score tile is then a real matmul, (heads, D) x (D, keys of the tile), where a tile of query rows would gather
another list for every row.

A list is read by the convention ``KeySets(duplicates="once", past_end="masked", padding="anywhere")``: -1 and
indices >= Nk name no key (their rows are never loaded), and an entry equal to an earlier one of the same row is
dropped (compared within the tile and against every earlier tile of the row: O(topk^2) compares per program, cheap
beside the loads for the top-k lengths served). The lists need not be sorted.
"""

from __future__ import annotations

import torch

from ...contract.validation import check_attention_inputs
from ...errors import InvalidArgument
from .online import BLOCK_N, pow2
from .runtime import import_triton

__all__ = ["MAX_BLOCK_H", "CheckedCall", "SparseArgs", "attend", "last_stride_one", "listed_keys", "switches", "value_tile",
           "visible_keys"]

MAX_BLOCK_H = 64  # query heads a program holds: more than that are split over programs
MAX_HEAD_DIM = 256  # a (BLOCK_H, 256) fp32 accumulator is the most a tile holds in registers
_MAX_GRID = 65535  # CUDA's limit on the second and third grid dimensions

triton, tl = import_triton()


@triton.jit
def listed_keys(idx_row, start, topk, n_k, row, causal_offset, CAUSAL: tl.constexpr, DEDUP: tl.constexpr,
                PADDING_MASKED: tl.constexpr, PAST_END_MASKED: tl.constexpr, BLOCK_N: tl.constexpr):
    """Entries ``start`` to ``start + BLOCK_N`` of a row's list: (key, shown), the key each names (0 where none,
    so the address is always in range) and whether the row attends it (listed, a key, its first listing, and
    causally visible). The planted bugs switch off the padding test (-1 read as key 0), the past-end test (read
    as the last key) or the dedup (a repeated key attended again)."""
    pos = start + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_row + pos, mask=pos < topk, other=-1)
    shown = pos < topk
    if PADDING_MASKED:
        shown = shown & (idx >= 0)
    if PAST_END_MASKED:
        shown = shown & (idx < n_k)
    key = tl.where(shown, tl.minimum(tl.maximum(idx, 0), n_k - 1), 0)
    if DEDUP:
        # an entry equal to an earlier one of the row: first within the tile, then in every earlier tile
        earlier = (idx[:, None] == idx[None, :]) & (pos[:, None] < pos[None, :])
        seen = tl.max(earlier.to(tl.int32), axis=0)
        for before in range(0, start, BLOCK_N):
            prev = tl.load(idx_row + before + tl.arange(0, BLOCK_N))  # all within the list: before < start
            seen = tl.maximum(seen, tl.max((prev[:, None] == idx[None, :]).to(tl.int32), axis=0))
        shown = shown & (seen == 0)
    if CAUSAL:
        shown = shown & (key <= row + causal_offset)
    return key.to(tl.int64), shown


@triton.jit
def visible_keys(shown, head_ok, heads_q, key, mask_row, smh, smn, HAS_MASK: tl.constexpr):
    """(BLOCK_H, BLOCK_N): the tile's shown keys for each query head of the block, less those the boolean mask
    hides (read for shown keys only)."""
    visible = head_ok[:, None] & shown[None, :]
    if HAS_MASK:
        allowed = tl.load(mask_row + heads_q.to(tl.int64)[:, None] * smh + key[None, :] * smn, mask=visible, other=0)
        visible = visible & (allowed != 0)
    return visible


def switches(mutant: str | None) -> dict:
    """The constexprs of :func:`listed_keys` that plant ``mutant`` (none for a correct kernel): the test dropped."""
    return dict(DEDUP=mutant != "counts_duplicates", PADDING_MASKED=mutant != "padding_reads_key0",
                PAST_END_MASKED=mutant != "past_end_clamped")


def last_stride_one(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()  # the kernels address the head dim with stride 1


class _Differentiable(torch.autograd.Function):
    """A forward over chosen keys with its Triton backward (:func:`attend`'s)."""

    @staticmethod
    def forward(ctx, q, k, v, call):
        a = call["args"](q, k, v)
        out, lse = call["forward"](a, call["mutant"])
        ctx.save_for_backward(out, lse)
        ctx.args, ctx.call = a, call
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        out, lse = ctx.saved_tensors
        do = last_stride_one(dout.to(out.dtype))
        return (*ctx.call["backward"](ctx.args, out, lse, do, ctx.call["mutant"]), None)


def attend(q, k, v, args, forward, backward, mutant: str | None):
    """``forward(args(q, k, v), mutant)``: (out, lse), differentiable through ``backward(args, out, lse, do,
    mutant)`` (dq, dk, dv) when q, k or v requires a gradient. ``args`` checks the call (a :class:`CheckedCall`)."""
    q, k, v = (last_stride_one(t) for t in (q, k, v))
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return _Differentiable.apply(q, k, v, dict(args=args, forward=forward, backward=backward, mutant=mutant))
    return forward(args(q, k, v), mutant)


def value_tile(head_dim_v: int, block_d: int) -> int:
    """Columns of the V tile: Dv padded, never narrower than the Q/K tile unless 64 wide or more (Triton 3.6 on
    Hopper miscompiles P @ V on narrower V tiles: flashcheck:triton's forward says more)."""
    return max(pow2(head_dim_v), min(block_d, 64))


def _check_indices(indices, q, shapes) -> torch.Tensor:
    want = f"({shapes.batch}, {shapes.heads_kv} or 1, {shapes.n_q}, topk)"
    fix = f"Pass indices as an int32 tensor {want} of key positions (-1 as padding) on q's device."
    if not isinstance(indices, torch.Tensor) or indices.dtype != torch.int32 or indices.dim() != 4:
        raise InvalidArgument("indices", getattr(indices, "dtype", indices), f"expected an int32 tensor {want}", fix)
    b, h, n, topk = indices.shape
    if b != shapes.batch or h not in (1, shapes.heads_kv) or n != shapes.n_q or topk == 0:
        raise InvalidArgument("indices", tuple(indices.shape), f"expected {want}", fix)
    if indices.device != q.device:
        raise InvalidArgument("indices", indices.device, f"on {indices.device}, q on {q.device}", fix)
    return indices.contiguous()


class CheckedCall:
    """An attention call checked for flashcheck's Triton kernels over chosen keys (index sets, key-block lists),
    with what their forward and backward kernels share: the inputs, the mask as uint8 bytes and its strides, the
    causal offset, the head-dim tiles and the constexpr flags. ``programs`` counts the (batch entry, head) pairs of
    the grid's last dimension, refused past CUDA's limit."""

    def __init__(self, q, k, v, *, scale, causal, attn_mask, programs=lambda s: s.batch * s.heads_kv):
        q, k, v, self.scale, self.causal, attn_mask, s = check_attention_inputs(q, k, v, scale=scale, causal=causal,
                                                                                 attn_mask=attn_mask)
        if max(s.head_dim, s.head_dim_v) > MAX_HEAD_DIM:
            raise InvalidArgument("q", tuple(q.shape), f"head dim above {MAX_HEAD_DIM}",
                                  f"Use head dims up to {MAX_HEAD_DIM}.")
        if programs(s) > _MAX_GRID:
            raise InvalidArgument("k", tuple(k.shape), f"batch * heads above {_MAX_GRID}",
                                  "Split the batch into several calls.")
        self.q, self.k, self.v, self.shapes = q, k, v, s
        if attn_mask is not None:  # uint8: the same bytes as bool, with a pointer type every Triton loads
            self.mask = torch.broadcast_to(attn_mask, (s.batch, s.heads_q, s.n_q, s.n_k)).view(torch.uint8)
            self.mask_strides = self.mask.stride()
        else:
            self.mask, self.mask_strides = q, (0, 0, 0, 0)  # never read: HAS_MASK is False
        self.causal_offset = {"none": 0, "top_left": 0, "bottom_right": s.n_k - s.n_q}[self.causal]
        block_d = pow2(s.head_dim)
        self.sizes = dict(D=s.head_dim, DV=s.head_dim_v, BD=block_d, BDV=value_tile(s.head_dim_v, block_d))
        self.flags = dict(CAUSAL=self.causal != "none", HAS_MASK=attn_mask is not None)


class SparseArgs(CheckedCall):
    """A sparse call checked, with what both kernels take: the launch grid, the strides and the tile sizes."""

    def __init__(self, q, k, v, indices, *, scale, causal, attn_mask):
        super().__init__(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        s = self.shapes
        self.indices = _check_indices(indices, self.q, s)
        self.block_h = min(MAX_BLOCK_H, pow2(s.group))
        self.grid = (s.n_q, triton.cdiv(s.group, self.block_h), s.batch * s.heads_kv)
        self.index_strides = (self.indices.stride(0), self.indices.stride(1) if self.indices.shape[1] > 1 else 0,
                              self.indices.stride(2))
        self.sizes.update(BLOCK_H=self.block_h, BLOCK_N=BLOCK_N)

    @property
    def runtime(self) -> tuple:
        """The sizes both kernels take at run time, in their order."""
        s = self.shapes
        return (s.n_q, s.n_k, self.indices.shape[-1], s.heads_kv, s.group, self.causal_offset)
