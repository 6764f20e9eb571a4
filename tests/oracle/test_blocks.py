"""The oracle and the budget give the same answer however the call is cut into blocks.

One block holds every head and row when memory allows; when it does not, the walk splits the rows,
then the heads. Each cut must land every value where it belongs (GQA groups, per-head masks, a
subset of rows), so the same case is computed with blocks of one row of one head and compared.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.contract.validation import Shapes
from flashcheck.numerics import blockwise
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.oracle import reference_attention


def _case(gqa: bool):
    gen = torch.Generator().manual_seed(3)
    B, Hq, Hkv, Nq, Nk, D, Dv = 2, 4, 2 if gqa else 4, 13, 21, 8, 5
    q = torch.randn(B, Hq, Nq, D, generator=gen).half()
    k = torch.randn(B, Hkv, Nk, D, generator=gen).half() * 3
    v = torch.randn(B, Hkv, Nk, Dv, generator=gen).half()
    mask = torch.rand(B, Hq, Nq, Nk, generator=gen) > 0.3  # a different mask on every head
    mask[1, 2, 4] = False  # one fully masked row
    return q, k, v, mask


@pytest.mark.parametrize("ops", ["numpy", "torch"])
@pytest.mark.parametrize("gqa", [False, True])
@pytest.mark.parametrize("rows", [None, [12, 0, 5]])
def test_blocks_of_one_row_of_one_head_give_the_same_answer(monkeypatch, ops, gqa, rows):
    if ops == "torch":
        monkeypatch.setenv("FLASHCHECK_TORCH_OPS", "1")
    q, k, v, mask = _case(gqa)
    kw = dict(scale=0.4, causal="bottom_right", attn_mask=mask, rows=rows)
    whole = error_budget(q, k, v, **kw)
    monkeypatch.setattr(blockwise, "CPU_BLOCK_ELEMENTS", 1)  # one row of one head per block
    cut = error_budget(q, k, v, **kw)
    ref_whole, ref_cut = whole.reference, cut.reference
    assert torch.equal(ref_whole.empty_rows, ref_cut.empty_rows) and bool(ref_cut.empty_rows.any()) == (rows is None)
    live = ~ref_whole.empty_rows[..., None].expand_as(ref_whole.out)
    # Other block shapes may change the float64 rounding, never by more than the two certified bounds.
    diff = (ref_whole.out - ref_cut.out).abs()[live]
    assert bool((diff <= ref_whole.bound[live] + ref_cut.bound[live]).all())
    assert torch.allclose(whole.total, cut.total, rtol=1e-9, atol=0)
    for name in whole.terms:
        assert torch.allclose(whole.terms[name], cut.terms[name], rtol=1e-9, atol=0), name


def test_the_fused_walk_equals_oracle_then_budget():
    q, k, v, mask = _case(gqa=True)
    kw = dict(scale=0.4, causal="top_left", attn_mask=mask)
    fused = error_budget(q, k, v, **kw)
    separate = error_budget(q, k, v, **kw, reference=reference_attention(q, k, v, **kw))
    assert torch.equal(fused.reference.out.nan_to_num(), separate.reference.out.nan_to_num())
    assert torch.allclose(fused.total, separate.total, rtol=1e-12, atol=0)


def test_gpu_blocks_are_sized_from_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    small = blockwise.block_elements("cuda")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 << 30, 80 << 30))
    large = blockwise.block_elements("cuda")
    assert small == int((8 << 30) * blockwise.GPU_FREE_SHARE) // (8 * blockwise.LIVE_ARRAYS)
    assert large == min(blockwise.GPU_BLOCK_ELEMENTS, 8 * small)


def test_blocks_of_one_head_keep_each_heads_sink(monkeypatch):
    from flashcheck.features.variant import Variant

    q, k, v, mask = _case(gqa=True)
    variant = Variant(sinks=torch.tensor([0.5, -1.0, 3.0, -math.inf]))
    kw = dict(scale=0.4, causal="bottom_right", attn_mask=mask, variant=variant)
    whole = error_budget(q, k, v, **kw)
    monkeypatch.setattr(blockwise, "CPU_BLOCK_ELEMENTS", 1)
    cut = error_budget(q, k, v, **kw)
    assert torch.allclose(whole.reference.lse, cut.reference.lse, rtol=1e-12, atol=0, equal_nan=True)
    assert torch.allclose(whole.total, cut.total, rtol=1e-9, atol=0, equal_nan=True)


def test_a_long_row_turns_one_kv_head_at_a_time_into_float64():
    # A decode step against 1M keys: 16 rows of 8 heads fit one work array, but K and V in float64 are 2 GiB a head.
    shapes = Shapes(1, 8, 8, 16, 1 << 20, 128, 128)
    assert blockwise._steps(shapes, 16, blockwise.CPU_BLOCK_ELEMENTS) == (1, 4)
    short = Shapes(1, 8, 8, 16, 1024, 128, 128)  # short rows: every head in one block, as before
    heads, rows = blockwise._steps(short, 16, blockwise.CPU_BLOCK_ELEMENTS)
    assert heads >= 8 and rows == 16
