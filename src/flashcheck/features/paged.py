"""The paged form: keys and values in a pool of pages, each sequence's found through its row of the
``block_table`` (:mod:`flashcheck.contract.forms` gives the convention)."""

from __future__ import annotations

from .forms import Form


def _text(case) -> str:
    return f", page size {case.page_size} of {case.num_blocks} pages"


def _relayout(case):
    """The page pool in another order, the block table renumbered to match."""
    return case.with_pages_permuted(case.num_blocks)


FORM = Form("paged", indices={"out": "[b, i, h, k]", "lse": "[b, h, i]"}, tensors=("q", "k_cache", "v_cache"),
            text=_text, relayout=_relayout)
