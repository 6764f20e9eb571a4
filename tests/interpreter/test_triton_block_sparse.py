"""flashcheck's Triton block-sparse kernel (key-block lists, blocks 16 x 16) under the Triton interpreter: it passes
drawn cases in fp16 and fp32, forward and backward, never reads a key no list names, refuses lists of the wrong
dtype by name, and each planted bug (the lists misread, dK and dV written instead of added) is a BUG within 40
drawn cases. Small shapes, few cases."""

from __future__ import annotations

import pytest
import torch

from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.backward import check_backward
from flashcheck.judge.check import check
from flashcheck.kernels.planted import TRITON_BLOCK_SPARSE
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.triton.block_sparse import FORWARD_BUGS

from tests._planted import assert_listed, assert_passes_drawn, first_catching_case

pytestmark = pytest.mark.interpreter

NAME = "flashcheck:triton-block-sparse"
SMALL = dict(max_n=40, max_batch=1, max_heads=4, head_dims=[16, 24])


def _kernel(bug: str | None = None):
    return resolve_kernel(NAME + (f"~{bug}" if bug else ""), device="cpu")


def test_the_kernel_is_listed_with_its_planted_bugs():
    assert_listed(NAME, TRITON_BLOCK_SPARSE)


def test_the_kernel_passes_drawn_cases_in_fp16_and_fp32():
    assert_passes_drawn(_kernel(), 6, seed=1, **SMALL)


def test_keys_no_list_names_are_never_read():
    case = Recipe(Shapes(1, 2, 1, 20, 40, 16, 16), "fp32", seed=1, causal="bottom_right",
                  variants={"block_lists": "sparse"}, settings={"block_size": "16x16", "full_blocks": "masked"}).build()
    verdict = check(_kernel(), case, device="cpu", properties=("poison",))
    assert verdict.status == "PASS" and "poison" in verdict.properties, str(verdict)


def test_lists_of_another_dtype_are_refused_by_name():
    q = torch.zeros(1, 2, 3, 16)
    with pytest.raises(InvalidArgument) as raised:
        _kernel().fn(q, q, q, scale=1.0, kv_num_blocks=torch.ones(1, 1, 1, dtype=torch.int64),
                     kv_indices=torch.zeros(1, 1, 1, 1, dtype=torch.int32))
    assert raised.value.argument == "kv_num_blocks" and "int32" in raised.value.fix


@pytest.mark.parametrize("bug", FORWARD_BUGS)
def test_each_misread_of_the_lists_is_caught_within_40_cases(bug):
    kernel = _kernel(bug)
    assert first_catching_case(kernel, **SMALL) is not None, f"{kernel.name} passed 40 cases"


def test_the_gradients_of_drawn_cases_stay_within_the_budget():
    kernel = _kernel()
    assert kernel.spec.backward and not kernel.spec.deterministic_backward  # atomic adds into the key blocks
    assert_passes_drawn(kernel, 5, seed=7, judge=lambda k, case: check_backward(k, case, device="cpu"), **SMALL)


def test_dk_written_not_added_is_caught_within_40_cases():
    kernel = _kernel("dk_written_not_added")
    caught = first_catching_case(kernel, judge=lambda k, case: check_backward(k, case, device="cpu"), **SMALL)
    assert caught is not None, f"{kernel.name} passed 40 cases"
