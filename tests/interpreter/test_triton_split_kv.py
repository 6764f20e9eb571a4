"""flashcheck's Triton split-KV decoding under the Triton interpreter: partial states per split, then a Triton
merge, judged at every split count of its spec (1, 2, 3, 16, 32: some splits empty). It passes on paged
batches with empty sequences and bottom-right causal; its planted bugs (an empty split's 0 / 0 in the merge,
partial lse in base 2) are BUGs at the split counts where they show."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import serving_case
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.split_kv import SPLIT_COUNTS

pytestmark = pytest.mark.interpreter

NAME = "flashcheck:triton-split-kv"


def _case(causal="bottom_right", packing="ragged", pages="16"):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, 3, 24, generator=gen).half()
    k, v = (torch.randn(3, 1, 40, 24, generator=gen).half() for _ in range(2))
    base = AttentionCase.create(q, k, v, scale=24 ** -0.5, causal=causal)
    return serving_case(base, form="paged", packing=packing, pages=pages, poison="huge", seed=3)


def test_the_split_kernel_passes_at_every_split_count():
    assert resolve_kernel(NAME, device="cpu").spec.num_splits == SPLIT_COUNTS
    verdict = flashcheck.check(NAME, _case(packing="empty_sequences", pages="nondividing"), device="cpu")
    assert verdict.ok and {"isolation", "page_order"} <= set(verdict.properties), str(verdict)
    assert flashcheck.check(NAME, _case(causal="none", pages="1"), device="cpu", properties=()).ok


def test_empty_splits_merged_into_nan_are_found_where_a_split_is_empty():
    case = _case(causal="none")
    assert min(case.k_lens) >= 3  # 1, 2 and 3 splits are never empty here
    verdict = flashcheck.check(f"{NAME}~empty_split_nan", case, device="cpu", properties=())
    assert {f.kind for f in verdict.findings} == {"nonfinite"}, str(verdict)
    assert all(f.diagnosis.startswith(("num_splits=16", "num_splits=32")) for f in verdict.findings)


def test_partial_lse_in_base_2_is_a_bug_and_named():
    verdict = flashcheck.check(f"{NAME}~lse_base2", _case(), device="cpu", properties=())
    assert {"over_budget", "lse"} <= {f.kind for f in verdict.findings}, str(verdict)
    assert any("matches an lse in log2" in f.diagnosis for f in verdict.findings if f.kind == "lse")


def test_a_bad_split_count_is_refused_by_name():
    inputs = _case().physical("cpu")
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(NAME, device="cpu").fn(*inputs.tensors, **inputs.kwargs, scale=1.0, num_splits=0)
    assert info.value.argument == "num_splits"
