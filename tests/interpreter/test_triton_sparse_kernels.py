"""What flashcheck's two Triton sparse kernels (index sets, key-block lists) are each held to under the Triton
interpreter: listed with their planted bugs, drawn cases passing in fp16 and fp32 forward and backward, and each
planted bug a BUG within 40 drawn cases. Small shapes, few cases. Each kernel's own cases are in its file."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from flashcheck.kernels.planted import TRITON_BLOCK_SPARSE, TRITON_SPARSE
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.triton import block_sparse, sparse

from tests._planted import assert_listed, assert_passes_drawn, backward_judge, first_catching_case

pytestmark = pytest.mark.interpreter


@dataclass(frozen=True)
class Subject:
    name: str
    bugs: tuple  # the catalog, in the listing's order
    forward_bugs: tuple
    draw: dict  # small shapes: one index-set program holds one query row, a block-list one a block

    def kernel(self, bug: str | None = None):
        return resolve_kernel(self.name + (f"~{bug}" if bug else ""), device="cpu")


SUBJECTS = [Subject("flashcheck:triton-sparse", TRITON_SPARSE, sparse.FORWARD_BUGS,
                    dict(max_n=20, max_batch=1, max_heads=4, head_dims=[16, 24])),
            Subject("flashcheck:triton-block-sparse", TRITON_BLOCK_SPARSE, block_sparse.FORWARD_BUGS,
                    dict(max_n=40, max_batch=1, max_heads=4, head_dims=[16, 24]))]
IDS = [s.name for s in SUBJECTS]


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_the_kernel_is_listed_with_its_planted_bugs(subject):
    assert_listed(subject.name, subject.bugs)


@pytest.mark.parametrize("subject", SUBJECTS, ids=IDS)
def test_the_kernel_passes_drawn_cases_forward_and_backward(subject):
    kernel = subject.kernel()
    assert_passes_drawn(kernel, 6, seed=1, **subject.draw)
    assert kernel.spec.backward and not kernel.spec.deterministic_backward  # atomic adds of dK and dV
    assert_passes_drawn(kernel, 5, seed=7, judge=backward_judge, **dict(subject.draw, max_n=16))


@pytest.mark.parametrize("subject, bug", [(s, b) for s in SUBJECTS for b in s.forward_bugs + ("dk_written_not_added",)],
                         ids=[f"{s.name}~{b}" for s in SUBJECTS for b in s.forward_bugs + ("dk_written_not_added",)])
def test_each_planted_bug_is_caught_within_40_cases(subject, bug):
    kernel = subject.kernel(bug)
    judge = backward_judge if bug == "dk_written_not_added" else None
    assert first_catching_case(kernel, judge=judge, **subject.draw) is not None, f"{kernel.name} passed 40 cases"
