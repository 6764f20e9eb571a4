"""What ``flashcheck:triton-block-sparse``'s forward and backward kernels share: how a row of a key-block list is
counted (:func:`list_count`), how one of its entries becomes a key tile with what each query of the program sees of
it (:func:`key_block`), and the host's record of a call (:class:`BlockArgs`: the checked inputs, the lists stacked
for the kernels, the grid and the tile sizes).

The layout is FlexAttention's: a program holds one query block of one query head (the tile is the block, so
``q_block`` x ``kv_block`` are the tile sizes), and walks its row of each list. The lists the kernel is handed
(``kv_num_blocks`` (B or 1, H or 1, Q_blocks), ``kv_indices`` (B or 1, H or 1, Q_blocks, M), H the query heads or
1, and the full lists alike or None) are broadcast to every batch entry and query head and stacked, the partial
lists first: row ``list * programs + program`` of the stacked counts is a program's row of that list, and its
entries are the same row of the stacked indices (the narrower list padded with -1, which names no key).

An entry names a key block; its keys past Nk and before 0 are never loaded. Inside a block the causal alignment
and the mask apply (``RULES``; a masked full block too). A key no query of the program sees is never read, so NaN
in it cannot reach the output. A block listed twice in a row, or in both lists, is attended twice: the lists the
block-list regimes draw (and FlexAttention's) name each block once.
"""

from __future__ import annotations

import torch

from ...errors import InvalidArgument
from .runtime import import_triton
from .sparse_keys import CheckedCall

__all__ = ["BlockArgs", "key_block", "list_count", "program_block", "switches"]

triton, tl = import_triton()


@triton.jit
def program_block(heads_q, group, n_q, BLOCK_M: tl.constexpr):
    """What a program holds: (b, query head, K/V head, rows, row_ok, row), the first three int64, its query rows
    (int64) and which exist, and its row of the partial list (the full list's is one list further)."""
    q_block, bh = tl.program_id(0), tl.program_id(1)
    h = bh % heads_q
    rows = (q_block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    return ((bh // heads_q).to(tl.int64), h.to(tl.int64), (h // group).to(tl.int64), rows, rows < n_q,
            bh * tl.num_programs(0) + q_block)


@triton.jit
def list_count(NUM, row, width, OFF_BY_ONE: tl.constexpr):
    """How many entries of the list row ``row`` are visited; ``OFF_BY_ONE`` (a planted bug) reads one more, within
    the row."""
    count = tl.load(NUM + row)
    if OFF_BY_ONE:
        count = tl.minimum(count + 1, width)
    return count


@triton.jit
def key_block(IDX, row, entry, width, rows, row_ok, n_k, causal_offset, mask_rows, smn, k_base, v_base, skn, svn,
              dims, dims_v, D, DV, RULES: tl.constexpr, CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr,
              IN_BOUNDS: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key block of entry ``entry`` of list row ``row``: (cols, visible, read, k, v), its key positions, the
    (BLOCK_M, BLOCK_N) pairs the program's queries see (within the keys; causal and the mask under ``RULES``),
    the keys some query sees, and K (BLOCK_N, BD) and V (BLOCK_N, BDV) loaded at those keys only (0 elsewhere).
    Without ``IN_BOUNDS`` (a planted bug) the block's positions past Nk are seen as keys, their K and V 0."""
    block = tl.load(IDX + row.to(tl.int64) * width + entry)
    cols = block * BLOCK_N + tl.arange(0, BLOCK_N)
    exists = (cols >= 0) & (cols < n_k)
    if IN_BOUNDS:
        visible = row_ok[:, None] & exists[None, :]
    else:
        visible = row_ok[:, None] & (cols >= 0)[None, :]
    if RULES:
        if CAUSAL:
            visible = visible & (cols[None, :] <= rows[:, None] + causal_offset)
        if HAS_MASK:
            allowed = tl.load(mask_rows + cols.to(tl.int64)[None, :] * smn, mask=visible & exists[None, :], other=0)
            visible = visible & (allowed != 0)
    read = exists & (tl.max(visible.to(tl.int32), axis=0) > 0)
    keys = cols.to(tl.int64)
    k = tl.load(k_base + keys[:, None] * skn + dims[None, :], mask=read[:, None] & (dims[None, :] < D), other=0.0)
    v = tl.load(v_base + keys[:, None] * svn + dims_v[None, :], mask=read[:, None] & (dims_v[None, :] < DV),
                other=0.0)
    return keys, visible, read, k, v


def switches(mutant: str | None) -> dict:
    """The constexprs that plant ``mutant`` (none for a correct kernel)."""
    return dict(OFF_BY_ONE=mutant == "count_off_by_one", IN_BOUNDS=mutant != "tail_block_as_full",
                FULL_RULES=mutant != "full_list_trusted")


def _check_list(name: str, t, dims: int, want: str, q) -> torch.Tensor:
    fix = (f"Pass {name} as an int32 tensor {want} on q's device (FlexAttention's BlockMask layout: "
           "kv_num_blocks (B, H, Q_blocks), kv_indices (B, H, Q_blocks, M)).")
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != dims:
        raise InvalidArgument(name, getattr(t, "dtype", t), f"expected an int32 tensor {want}", fix)
    if t.device != q.device:
        raise InvalidArgument(name, t.device, f"on {t.device}, q on {q.device}", fix)
    return t


class BlockArgs(CheckedCall):
    """A block-sparse call checked, with what both kernels take: the stacked lists, the grid, the strides and the
    tile sizes (the blocks)."""

    def __init__(self, q, k, v, lists: dict, *, scale, causal, attn_mask, q_block: int, kv_block: int):
        super().__init__(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                         programs=lambda s: s.batch * s.heads_q)
        s = self.shapes
        q_blocks = triton.cdiv(s.n_q, q_block)
        rows = (s.batch, s.heads_q, q_blocks)
        want = f"({s.batch} or 1, {s.heads_q} or 1, {q_blocks})"
        pairs = [("kv_num_blocks", "kv_indices")]
        if (lists.get("full_kv_num_blocks") is None) != (lists.get("full_kv_indices") is None):
            raise InvalidArgument("full_kv_indices", None, "full_kv_num_blocks and full_kv_indices come together",
                                  "Pass both or neither.")
        if lists.get("full_kv_num_blocks") is not None:
            pairs.append(("full_kv_num_blocks", "full_kv_indices"))
        nums, idxs = [], []
        for num_name, idx_name in pairs:
            num = _check_list(num_name, lists.get(num_name), 3, want, self.q)
            idx = _check_list(idx_name, lists.get(idx_name), 4, want[:-1] + ", M)", self.q)
            if (num.shape[0] not in (1, s.batch) or num.shape[1] not in (1, s.heads_q) or num.shape[2] != q_blocks
                    or idx.shape[:3] != num.shape):
                raise InvalidArgument(idx_name, (tuple(num.shape), tuple(idx.shape)), f"expected {want} and "
                                      f"{want[:-1]}, M) for {s.n_q} queries in blocks of {q_block}",
                                      "Pass one list row per query block.")
            nums.append(num.expand(rows))
            idxs.append(idx.expand(*rows, idx.shape[-1]))
        self.width = max(1, *(t.shape[-1] for t in idxs))
        self.num = torch.stack(nums).contiguous()
        self.idx = torch.stack([torch.nn.functional.pad(t, (0, self.width - t.shape[-1]), value=-1)
                                for t in idxs]).contiguous()
        self.grid = (q_blocks, s.batch * s.heads_q)
        self.sizes.update(BLOCK_M=q_block, BLOCK_N=kv_block, LISTS=len(pairs))

    @property
    def runtime(self) -> tuple:
        """The sizes both kernels take at run time, in their order."""
        s = self.shapes
        return (s.n_q, s.n_k, s.heads_q, s.group, self.causal_offset, self.width)
