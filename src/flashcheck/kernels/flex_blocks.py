"""``torch:flex-block-sparse``: FlexAttention's block-sparse path, handed the case's key-block lists
(:mod:`flashcheck.contract.block_sparse`) as its ``BlockMask``.

The lists go to ``BlockMask.from_kv_blocks`` as they are: the compiled kernel visits the first ``kv_num_blocks``
key blocks of each query block's row, applies the ``mask_mod`` inside them and skips it in the full blocks
(FlexAttention trusts its full-block lists: declared ``full_blocks="trusted"``). The ``mask_mod`` is the case's
causal alignment and mask within the listed blocks, and every key of a full block: FlexAttention's documented rule
that the block lists only skip what the ``mask_mod`` hides. Measured (torch 2.13, CPU): the eager path ignores the
lists and reads the ``mask_mod`` alone, so without the lists in the ``mask_mod`` the two paths disagree (by up to
1.26 on 40 x 70 keys).

Blocks default to FlexAttention's 128 x 128; the options ``q_block`` and ``kv_block`` set others. ``compile=False``
runs the eager path. lse as ``torch:flex`` returns it (none from the compiled CPU kernel). No backward.
"""

from __future__ import annotations

import torch

from ..contract.block_sparse import BlockSparse
from ..contract.formats import DTYPES
from ..contract.masks import and_masks, or_masks
from ..contract.spec import Kernel, KernelSpec
from ..contract.validation import CAUSAL_MODES
from ..features.block_lists import BlockLists, block_tables
from .adapters import validated_call
from .flex import (check_available, compiled_flex, flex_heads, flex_module, flex_options, flex_outputs, restriction_mod,
                   run_flex)

__all__ = ["NAME", "make_flex_block_sparse_kernel"]

NAME = "torch:flex-block-sparse"


def _lookup(table: torch.Tensor, q_block: int, kv_block: int):
    """The mask_mod of a (B or 1, H or 1, Q_blocks, KV_blocks) block table: a captured tensor, no recompile."""
    pick = lambda i, n: i if n > 1 else torch.zeros_like(i)  # noqa: E731  (size-1 dims broadcast)

    def block_mod(b, h, q_idx, kv_idx):
        return table[pick(b, table.shape[0]), pick(h, table.shape[1]), q_idx // q_block, kv_idx // kv_block]

    return block_mod


def _block_mask(fa, lists: BlockLists, base, shapes, device):
    listed, whole = (None if t is None else t.to(device) for t in block_tables(lists, shapes.n_k))
    mod = _lookup(listed, lists.q_block, lists.kv_block)
    mod = mod if base is None else and_masks(mod, base)
    if whole is not None:
        mod = or_masks(mod, _lookup(whole, lists.q_block, lists.kv_block))
    kw = lists.keywords(device)
    return fa.BlockMask.from_kv_blocks(kw["kv_num_blocks"], kw["kv_indices"], kw["full_kv_num_blocks"],
                                       kw["full_kv_indices"], BLOCK_SIZE=(lists.q_block, lists.kv_block),
                                       mask_mod=mod, seq_lengths=(shapes.n_q, shapes.n_k))


def make_flex_block_sparse_kernel(*, device: str = "cuda", compile: bool = True, q_block: int = 128,
                                  kv_block: int = 128) -> Kernel:
    """FlexAttention's block-sparse path on ``device`` with blocks of ``q_block`` x ``kv_block``."""
    check_available(device, compile, name=NAME)
    convention = BlockSparse(q_block, kv_block, "trusted")
    returns_lse = not (compile and device == "cpu")
    spec = KernelSpec(dtypes=DTYPES, causal=CAUSAL_MODES, attn_mask=True, gqa=True,
                      min_head_dim=16 if (compile and device == "cuda") else 1, max_head_dim=256, dv_equals_d=False,
                      fully_masked_rows="zero", precision="flash", devices=(device,), nan_safe_masking=False,
                      block_sparse=convention)

    def attention(q, k, v, *, scale, causal="none", attn_mask=None, kv_num_blocks, kv_indices,
                  full_kv_num_blocks=None, full_kv_indices=None):
        q, k, v, scale, causal, attn_mask, shapes = validated_call(
            NAME, device, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        fa = flex_module()
        lists = BlockLists(kv_num_blocks, kv_indices, q_block, kv_block, full_kv_num_blocks, full_kv_indices, True)
        k, v, gqa = flex_heads(q, k, v, shapes, compile and device == "cuda")
        fn = compiled_flex(fa, device) if compile else fa.flex_attention

        def mods():
            base, _, _ = restriction_mod(fa, causal, attn_mask, shapes, q.device)
            return dict(key=k, value=v, block_mask=_block_mask(fa, lists, base, shapes, q.device))

        return flex_outputs(run_flex(fn, q, mods, flex_options(fa, scale, gqa, returns_lse)), returns_lse)

    attention.__name__ = attention.__qualname__ = "flex_block_sparse"
    options = ([] if compile else ["compile=False"]) + [f"{n}={b}" for n, b in (("q_block", q_block),
                                                                               ("kv_block", kv_block)) if b != 128]
    return Kernel(attention, spec, name=f"{NAME}[{','.join(options)}]" if options else NAME)
