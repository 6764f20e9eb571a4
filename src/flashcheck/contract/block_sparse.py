"""Block-sparse attention: the convention a spec declares with ``block_sparse`` (FlexAttention's ``BlockMask``
lists, FA4's block-sparse tensors, NSA's and MoBA's selected blocks).

Queries and keys are cut into blocks of ``q_block`` and ``kv_block`` (the last of each may be partial). For each
query block, a kernel of this convention receives the key blocks it visits, in FlexAttention's layout:

- ``kv_num_blocks`` int32 (B, H, Q_blocks) and ``kv_indices`` int32 (B, H, Q_blocks, M): the first
  ``kv_num_blocks`` entries of a row are the visited key blocks (the rest of the row is never read); inside them
  the rest of the case (causal alignment, mask, window) still applies;
- ``full_kv_num_blocks`` and ``full_kv_indices`` (same shapes, or None): key blocks the caller says are fully
  visible.

H is the query heads or 1. What kernels differ on is declared: ``full_blocks`` ``"none"`` (the kernel takes no
full-block lists), ``"masked"`` (the rest of the case still applies inside a full block: a full list that is not
full changes nothing), or ``"trusted"`` (a full block is attended whole, the causal alignment and the mask
skipped there: FlexAttention's). ``required``: the kernel cannot be called without the lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .counts import check_count
from .declared import declared_record

__all__ = ["FULL_BLOCKS", "BlockSparse", "block_sparse"]

FULL_BLOCKS = ("none", "masked", "trusted")

_FIX = ("Declare block_sparse=True (blocks of 128 x 128, full-block lists masked) or "
        "block_sparse=flashcheck.BlockSparse(q_block=..., kv_block=..., full_blocks=..., required=...).")


@dataclass(frozen=True)
class BlockSparse:
    """The block sizes and the full-block convention of a block-sparse kernel (see the module's docstring)."""

    q_block: int = 128
    kv_block: int = 128
    full_blocks: str = "masked"
    required: bool = True

    def __post_init__(self):
        check_count("q_block", self.q_block, fix=_FIX)
        check_count("kv_block", self.kv_block, fix=_FIX)
        if self.full_blocks not in FULL_BLOCKS:
            raise InvalidArgument("full_blocks", self.full_blocks, "unknown convention",
                                  f"Use one of {list(FULL_BLOCKS)}. " + _FIX)
        if not isinstance(self.required, bool):
            raise InvalidArgument("required", self.required, "expected True or False", _FIX)

    @property
    def size(self) -> str:
        """The block sizes as a recipe records them, ``"QxK"``."""
        return f"{self.q_block}x{self.kv_block}"

    def as_dict(self) -> dict:
        return {"q_block": self.q_block, "kv_block": self.kv_block, "full_blocks": self.full_blocks,
                "required": self.required}


def block_sparse(value) -> BlockSparse | None:
    """A spec's ``block_sparse`` as a :class:`BlockSparse`: None or False (none), True (the defaults), a record, or a
    mapping of its fields."""
    return declared_record("block_sparse", value, BlockSparse, BlockSparse(), _FIX)
