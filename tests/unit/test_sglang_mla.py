"""SGLang's MLA decode as ``sglang:mla-decode``: where it cannot run (no CUDA, no sglang) it is refused by name
with the fix, and a sequence's queries become requests over the prefixes their rows see, in the block table's
slot order (what the kernel is handed, checked against a brute force written here)."""

from __future__ import annotations

import pytest
import torch

from flashcheck import BackendUnavailable, Unsupported
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.sglang_mla import _requests, unavailable


def test_on_the_cpu_it_is_refused_by_name_with_the_fix():
    problem = unavailable("cpu")
    assert problem is not None and "CUDA" in str(problem) and "--device cuda" in str(problem)
    with pytest.raises(BackendUnavailable) as raised:
        resolve_kernel("sglang:mla-decode", device="cpu")
    assert "sglang:mla-decode" in str(raised.value)


@pytest.mark.parametrize("causal", ["none", "bottom_right"])
def test_each_query_is_a_request_over_the_slots_its_row_sees(causal):
    page, n_q = 4, 3
    block_table = torch.tensor([[5, 2, 7], [1, 0, 0]], dtype=torch.int32)
    lengths = torch.tensor([10, 3], dtype=torch.int32)
    indptr, indices = _requests(block_table, lengths, n_q, page, causal)
    want = []
    for b, n in enumerate(lengths.tolist()):
        slots = [int(block_table[b, j // page]) * page + j % page + 1 for j in range(n)]  # after the padding slot
        for i in range(n_q):
            seen = max(0, n - n_q + 1 + i) if causal == "bottom_right" else n
            want.append(slots[:seen])
    assert indptr.tolist() == [0] + torch.tensor([len(w) for w in want]).cumsum(0).tolist()
    assert indices.tolist() == [s for w in want for s in w]
    assert indices.dtype == torch.int64 and indptr.dtype == torch.int32


@pytest.mark.parametrize("lengths, causal", [([4, 0], "none"), ([4, 2], "bottom_right")])
def test_a_request_with_no_key_is_unsupported(lengths, causal):
    block_table = torch.tensor([[0], [1]], dtype=torch.int32)
    with pytest.raises(Unsupported) as raised:
        _requests(block_table, torch.tensor(lengths, dtype=torch.int32), 3, 4, causal)
    assert "no key" in str(raised.value)
