"""flashcheck's Triton block-sparse kernel (key-block lists, blocks 16 x 16) under the Triton interpreter, its own
cases: no key no list names read, lists of the wrong dtype refused by name. What both Triton sparse kernels are held
to (drawn cases, planted bugs) is in test_triton_sparse_kernels.py."""

from __future__ import annotations

import pytest
import torch

from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel

pytestmark = pytest.mark.interpreter


def _kernel(bug: str | None = None):
    return resolve_kernel("flashcheck:triton-block-sparse" + (f"~{bug}" if bug else ""), device="cpu")


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


