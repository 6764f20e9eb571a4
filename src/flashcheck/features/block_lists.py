"""Block-sparse key lists: ``block_lists``, a :class:`BlockLists` of the key blocks each query block visits (spec
``block_sparse``, read by the convention of :mod:`flashcheck.contract.block_sparse`). The kernel receives its four
tensors as FlexAttention's keywords ``kv_num_blocks``, ``kv_indices``, ``full_kv_num_blocks`` and
``full_kv_indices``. A key is visible when its block is listed for its query's block (and the rest of the case shows
it), or when its block is a trusted full block.

Its regimes are drawn from where reported bugs cluster: unsorted and sorted lists, empty lists, the partial tail
block, rows whose unused entries name real blocks (a count read one too far), lists wider than the sequence's
blocks, and full-block lists that are not full."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import InvalidArgument
from .base import Feature
from .draws import upto

__all__ = ["FEATURE", "BlockLists", "block_list_script", "block_tables", "KEYWORDS"]

KEYWORDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
# Drawn only for a kernel that takes full-block lists. Its blocks are drawn apart from the case's causal alignment
# and mask, so most are not full: a kernel that trusts a list it declared masked attends what it must not.
FULL_REGIMES = ("full_lists",)


@dataclass(frozen=True, eq=False)
class BlockLists:
    """The key blocks of each query block: ``kv_num_blocks`` (B, H, Q_blocks) and ``kv_indices`` (B, H, Q_blocks, M)
    int32 (H: query heads or 1), optional full-block lists of the same shapes, the block sizes, and whether full
    blocks are attended whole (``trusted``) or under the rest of the case."""

    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    q_block: int
    kv_block: int
    full_kv_num_blocks: torch.Tensor | None = None
    full_kv_indices: torch.Tensor | None = None
    trusted: bool = False

    def __post_init__(self):
        fix = ("Pass kv_num_blocks (B, H, Q_blocks) and kv_indices (B, H, Q_blocks, M) int32, each count at most M, "
               "each listed entry a key block; full_kv_* alike or None.")
        for name in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"):
            t = getattr(self, name)
            if t is None:
                continue
            t = torch.as_tensor(t)
            if t.is_floating_point() or t.dtype == torch.bool or t.dim() != (3 if "num" in name else 4):
                raise InvalidArgument(name, tuple(t.shape), "expected an int32 tensor of "
                                      f"{3 if 'num' in name else 4} dims", fix)
            object.__setattr__(self, name, t.detach().to("cpu", torch.int32).clone())
        if (self.full_kv_num_blocks is None) != (self.full_kv_indices is None):
            raise InvalidArgument("full_kv_indices", None, "full_kv_num_blocks and full_kv_indices come together", fix)
        for num, idx in self.lists():
            if num.shape != idx.shape[:3] or bool((num < 0).any()) or bool((num > idx.shape[-1]).any()):
                raise InvalidArgument("kv_num_blocks", tuple(num.shape), "counts must be 0..M, one per row", fix)

    def lists(self):
        """(counts, indices) of the partial lists, then of the full ones where given."""
        out = [(self.kv_num_blocks, self.kv_indices)]
        return out + ([] if self.full_kv_num_blocks is None else [(self.full_kv_num_blocks, self.full_kv_indices)])

    def __eq__(self, other) -> bool:
        if not isinstance(other, BlockLists) or self.as_json() != other.as_json():
            return False
        return True

    __hash__ = None

    def as_json(self) -> dict:
        out = {"q_block": self.q_block, "kv_block": self.kv_block, "trusted": self.trusted}
        for name in KEYWORDS:
            t = getattr(self, name)
            out[name] = None if t is None else t.tolist()
        return out

    @classmethod
    def from_json(cls, data: dict) -> "BlockLists":
        return cls(**{k: torch.tensor(v, dtype=torch.int32) if k in KEYWORDS and v is not None else v
                      for k, v in data.items()})

    def keywords(self, device) -> dict:
        return {name: None if getattr(self, name) is None else getattr(self, name).to(device, copy=True)
                for name in KEYWORDS}

    def cut(self, batch, heads) -> "BlockLists":
        def part(t):
            if t is None:
                return None
            t = t[batch] if t.shape[0] > 1 else t
            return t[:, heads] if t.shape[1] > 1 else t
        return BlockLists(*(part(t) for t in (self.kv_num_blocks, self.kv_indices)), self.q_block, self.kv_block,
                          part(self.full_kv_num_blocks), part(self.full_kv_indices), self.trusted)


def block_tables(lists: BlockLists, n_k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(listed, whole): bool (B, H, Q_blocks, KV_blocks) of the key blocks a query block visits under the rest of
    the case, and of those it attends whole (trusted full blocks; None without)."""
    kv_blocks = math.ceil(n_k / lists.kv_block)
    tables = []
    for num, idx in lists.lists():
        used = torch.arange(idx.shape[-1]) < num[..., None]
        valid = used & (idx >= 0) & (idx < kv_blocks)
        table = torch.zeros((*idx.shape[:3], kv_blocks), dtype=torch.int32)
        tables.append(table.scatter_add_(-1, torch.where(valid, idx, 0).long(), valid.to(torch.int32)) > 0)
    listed, full = tables[0], (tables[1] if len(tables) > 1 else None)
    if full is None or lists.trusted:
        return listed, full
    return listed | full, None


def _lookup(table: torch.Tensor, lists: BlockLists, heads_q: int):
    """The mask_mod of ``table`` (B or 1, H or 1, Q_blocks, KV_blocks) at each query's and key's block."""
    del heads_q  # H is the query heads or 1: no grouping

    def block_mod(b, h, q_idx, kv_idx):
        t = table.to(q_idx.device) if torch.is_tensor(q_idx) else table
        b = b if t.shape[0] > 1 else 0
        h = h if t.shape[1] > 1 else 0
        return t[b, h, q_idx // lists.q_block, kv_idx // lists.kv_block]

    return block_mod


def _visible(lists: BlockLists, n_q: int, n_k: int, heads_q: int):
    return _lookup(block_tables(lists, n_k)[0], lists, heads_q)


def _shown(lists: BlockLists, n_q: int, n_k: int, heads_q: int):
    whole = block_tables(lists, n_k)[1]
    return None if whole is None else _lookup(whole, lists, heads_q)


def block_list_script(lists, offset, device, shown=False):
    """The block lists' mask_mod in a reproducer script, asked once for every query and key at once (q_idx (Nq, 1),
    kv_idx (1, Nk)), its answer (B or 1, H or 1, Nq, Nk): ``lists`` holds the four keywords, the block sizes and
    ``trusted``. Key j is visible to query i where j's block is among the first counted entries of i's block's
    lists (the full ones too, unless trusted); with ``shown``, where it is a trusted full block (else None).
    Torch only: a script copies it."""
    full = lists["full_kv_num_blocks"] is not None
    if shown and not (full and lists["trusted"]):
        return None
    names = ["full_kv"] if shown else ["kv"] + (["full_kv"] if full and not lists["trusted"] else [])

    def block_mod(b, h, q_idx, kv_idx):
        n_q, n_k = q_idx.shape[-2], kv_idx.shape[-1]
        kv_blocks = -(-n_k // lists["kv_block"])
        table = None
        for name in names:
            num, idx = lists[name + "_num_blocks"].to(device).long(), lists[name + "_indices"].to(device).long()
            used = (torch.arange(idx.shape[-1], device=device) < num[..., None]) & (idx >= 0) & (idx < kv_blocks)
            counts = torch.zeros((*idx.shape[:3], kv_blocks), dtype=torch.int32, device=device)
            listed = counts.scatter_add_(-1, torch.where(used, idx, 0), used.to(torch.int32)) > 0
            table = listed if table is None else table | listed
        rows = table.repeat_interleave(lists["q_block"], 2)[:, :, :n_q]
        return rows.repeat_interleave(lists["kv_block"], 3)[..., :n_k]

    return block_mod


def _check(value):
    if value is None or isinstance(value, BlockLists):
        return value
    raise InvalidArgument("block_lists", type(value).__name__, "expected a flashcheck.BlockLists",
                          "Build one with flashcheck.BlockLists(kv_num_blocks, kv_indices, q_block, kv_block).")


def _shape_problem(lists: BlockLists, shapes):
    q_blocks = math.ceil(shapes.n_q / lists.q_block)
    for num, idx in lists.lists():
        if num.shape[0] not in (1, shapes.batch) or num.shape[1] not in (1, shapes.heads_q) or num.shape[2] != q_blocks:
            return (tuple(num.shape), f"expected ({shapes.batch} or 1, {shapes.heads_q} or 1, {q_blocks}) for "
                    f"{shapes.n_q} queries in blocks of {lists.q_block}", "Pass one list per query block.")
    return None


def _refusal(variant, spec, dtype):
    convention, lists = spec.block_sparse, variant.block_lists
    if (lists.q_block, lists.kv_block) != (convention.q_block, convention.kv_block):
        return f"blocks of {lists.q_block}x{lists.kv_block}, the kernel's spec declares {convention.size}"
    if lists.full_kv_num_blocks is not None and convention.full_blocks == "none":
        return "full-block lists (the kernel's spec declares full_blocks='none')"
    if lists.trusted != (convention.full_blocks == "trusted"):
        return f"full blocks {'trusted' if lists.trusted else 'masked'}, the spec declares {convention.full_blocks!r}"
    return None


# ---- the regimes: each (gen, shapes, q_block, kv_block, trusted) -> BlockLists ----------------------------------


def _grid(gen, s, q_block: int, kv_block: int):
    heads = (1, s.heads_q)[upto(gen, 1)]
    return s.batch, heads, math.ceil(s.n_q / q_block), math.ceil(s.n_k / kv_block)


def _lists(gen, keep: torch.Tensor, *, order: str = "random", width: int | None = None):
    """(counts, indices) of the kept blocks of each row in ``order``, the unused entries naming real blocks (a
    count read one too far attends a block it must not)."""
    kv_blocks = keep.shape[-1]
    rank = torch.rand(keep.shape, generator=gen) if order == "random" else torch.arange(kv_blocks).expand(keep.shape)
    rank = torch.where(keep, rank.float(), rank.float() + kv_blocks + 1)  # kept blocks first
    idx = rank.argsort(-1).to(torch.int32)
    width = kv_blocks if width is None else width
    if width > kv_blocks:  # entries past the count, and past the sequence's blocks
        extra = torch.randint(0, width, (*keep.shape[:-1], width - kv_blocks), generator=gen, dtype=torch.int32)
        idx = torch.cat([idx, extra], -1)
    return keep.sum(-1).to(torch.int32), idx


def _kept(gen, shape, share: float) -> torch.Tensor:
    return torch.rand(shape, generator=gen) < share


def _sampled(order="random", share=0.5, width_extra=0, full=None):
    def draw(gen, s, q_block, kv_block, trusted):
        shape = _grid(gen, s, q_block, kv_block)
        keep = _kept(gen, shape, share)
        num, idx = _lists(gen, keep, order=order, width=shape[-1] + width_extra)
        fnum = fidx = None
        if full is not None:
            whole = _kept(gen, shape, 0.5) & ~keep
            fnum, fidx = _lists(gen, whole)
        return BlockLists(num, idx, q_block, kv_block, fnum, fidx, trusted)
    return draw


def _tail(gen, s, q_block, kv_block, trusted):
    """Only the last key block (partial where Nk is no multiple of the block), for every query block."""
    shape = _grid(gen, s, q_block, kv_block)
    keep = torch.zeros(shape, dtype=torch.bool)
    keep[..., -1] = True
    return BlockLists(*_lists(gen, keep), q_block, kv_block, trusted=trusted)


REGIMES = {
    "none": None,
    "sampled": _sampled(),
    "sorted": _sampled(order="sorted"),
    "every_block": _sampled(share=1.1),
    "empty_lists": _sampled(share=-1.0),
    "sparse": _sampled(share=0.2),
    "tail_block": _tail,
    "longer_than_sequence": _sampled(width_extra=3),
    "full_lists": _sampled(full=True, share=0.3),
}


def _draw(name, regime, gen, shapes, settings):
    q_block, kv_block = (int(x) for x in settings["block_size"].split("x"))
    return regime(gen, shapes, q_block, kv_block, settings.get("full_blocks") == "trusted")


def _settings(spec, dtype, regime, choose):
    convention = spec.block_sparse
    if regime in FULL_REGIMES and convention.full_blocks == "none":
        return None
    return {"block_size": convention.size, "full_blocks": convention.full_blocks}


FEATURE = Feature(
    name="block_lists", flag="block_sparse", term="keys", title="block-sparse lists",
    summary="the key blocks each query block visits (FlexAttention's BlockMask lists)",
    check=_check, text=lambda v: f"blocks {v.q_block}x{v.kv_block}" + (" +full" if v.full_kv_num_blocks is not None
                                                                       else ""),
    to_json=lambda v: v.as_json(), from_json=BlockLists.from_json, per_head=True, serving=False,
    shape_problem=_shape_problem, refusal=_refusal,
    required=lambda spec: bool(spec.block_sparse and spec.block_sparse.required),
    regimes=REGIMES, draw=_draw, settings=_settings,
    visible=_visible, shown=_shown, keywords=lambda v, device: v.keywords(device),
    cut=lambda v, batch, heads, group: v.cut(batch, heads),
    script={"mask_mod": block_list_script, "shown_mod": block_list_script},
)
