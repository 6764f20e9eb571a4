"""The float64 work of the oracle and the budget on a GPU goes through torch (``ops_for``): its matmul of a block's
query heads against their K/V head's one K or V takes the G query heads as rows of one matmul (torch.matmul would
copy K G times to broadcast it), with the same numbers as the broadcast matmul."""

from __future__ import annotations

import pytest
import torch

from flashcheck.numerics.blockwise import ops_for


@pytest.mark.parametrize("a_shape, b_shape", [
    ((3, 8, 5, 16), (3, 1, 16, 7)),   # query heads against their K/V head's K (transposed)
    ((1, 4, 2, 16), (3, 1, 16, 7)),   # one entry of a broadcast along the flattened heads
    ((3, 1, 5, 16), (3, 1, 16, 7)),   # no group: a plain matmul
    ((3, 8, 5, 16), (3, 8, 16, 7)),   # a side already per query head
])
def test_the_grouped_matmul_gives_the_broadcast_matmul_s_numbers(a_shape, b_shape, monkeypatch):
    monkeypatch.setenv("FLASHCHECK_TORCH_OPS", "1")
    ops = ops_for("cpu")
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in (a_shape, b_shape))
    got = ops.matmul(a, b)
    assert got.shape == torch.broadcast_shapes(a_shape[:2], b_shape[:2]) + (a_shape[2], b_shape[3])
    torch.testing.assert_close(got, torch.matmul(a, b), rtol=1e-12, atol=1e-12)
