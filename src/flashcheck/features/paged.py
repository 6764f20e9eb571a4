"""The paged form: keys and values in a pool of pages, each sequence's found through its row of the
``block_table`` (:mod:`flashcheck.contract.forms` gives the convention). A case's pages lie scrambled in the pool
among spare (poisoned) ones, in a page size of a regime (:data:`PAGE_REGIMES`)."""

from __future__ import annotations

import numpy as np
import torch

from .forms import Form, LayoutDraw

# Page sizes: 1, 16, 64, 256, and the smallest from 3 up that divides no sequence's key count.
PAGE_REGIMES = ("16", "1", "64", "256", "nondividing")


def _pools(spec) -> dict:
    """The page regimes of the page sizes the spec takes (a nondividing size only where it takes any)."""
    pages = [p for p in PAGE_REGIMES if spec.page_sizes is None or p == "nondividing" or int(p) in spec.page_sizes]
    if spec.page_sizes is not None:
        pages = [p for p in pages if p != "nondividing"] or [str(spec.page_sizes[0])]
    return {"pages": pages}


def _page_size(regime: str, k_lens: list[int]) -> int:
    if regime != "nondividing":
        return int(regime)
    size = 3
    while any(n and n % size == 0 for n in k_lens):
        size += 1
    return size


def _block_table(k_lens: list[int], page_size: int, rng: np.random.Generator) -> tuple[torch.Tensor, int]:
    """A block table whose sequences' pages lie scrambled in a pool with spare (poisoned) pages; entries past
    a sequence's pages point at spare pages."""
    pages = [-(-n // page_size) for n in k_lens]
    width = max(pages + [0]) + 1  # one column past the longest sequence's pages
    spare = 1 + int(rng.integers(0, 4))
    num_blocks = sum(pages) + spare
    order = rng.permutation(num_blocks)
    table, used = np.empty((len(k_lens), width), dtype=np.int32), 0
    for b, count in enumerate(pages):
        table[b, :count] = order[used:used + count]
        table[b, count:] = order[sum(pages) + rng.integers(0, spare, width - count)]
        used += count
    return torch.from_numpy(table), num_blocks


def _layout(d: LayoutDraw) -> dict:
    size = _page_size(d.regime, d.k_lens)
    table, num_blocks = _block_table(d.k_lens, size, d.rng)
    return {"q_lens": [d.shapes.n_q] * d.shapes.batch, "page_size": size, "block_table": table,
            "num_blocks": num_blocks}


def _text(case) -> str:
    return f", page size {case.page_size} of {case.num_blocks} pages"


def _relayout(case):
    """The page pool in another order, the block table renumbered to match."""
    return case.with_pages_permuted(case.num_blocks)


FORM = Form("paged", indices={"out": "[b, i, h, k]", "lse": "[b, h, i]"}, tensors=("q", "k_cache", "v_cache"),
            text=_text, relayout=_relayout, pool="pages", regimes=PAGE_REGIMES, pools=_pools, layout=_layout,
            decode=True, json_keys=("page_size", "num_blocks"), arrays={"block_table": "int32"})
