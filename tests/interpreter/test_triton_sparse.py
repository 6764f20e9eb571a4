"""flashcheck's Triton sparse kernel (top-k gather over index sets) under the Triton interpreter, its own cases: a
key repeated in a later tile of its list attended once, no key no list names read, indices of the wrong dtype
refused by name, a key chosen by many queries given the sum of their gradients. What both Triton sparse kernels are
held to (drawn cases, planted bugs) is in test_triton_sparse_kernels.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashcheck import Variant, check_backward
from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel

pytestmark = pytest.mark.interpreter


def _kernel(bug: str | None = None):
    return resolve_kernel("flashcheck:triton-sparse" + (f"~{bug}" if bug else ""), device="cpu")


def _case(indices: torch.Tensor, n_k: int = 12, causal: str = "none"):
    case = Recipe(Shapes(1, 2, 1, indices.shape[2], n_k, 16, 16), "fp16", seed=5, causal=causal).build()
    return dataclasses.replace(case, variant=Variant(indices=indices))


def test_a_key_repeated_in_a_later_tile_is_attended_once():
    """40 entries, two tiles of 32: key 3 first at entry 1 and again at 35; -1 and past-end entries between."""
    row = [7, 3] + [-1] * 30 + [11, 12, 99, 3, 0, -1, 5, 3]
    indices = torch.tensor([row, row[::-1]], dtype=torch.int32).view(1, 1, 2, 40)
    assert check(_kernel(), _case(indices), device="cpu", properties=()).status == "PASS"
    assert check(_kernel("counts_duplicates"), _case(indices), device="cpu", properties=()).status == "BUG"


def test_keys_no_list_names_are_never_read():
    case = Recipe(Shapes(1, 2, 1, 3, 40, 16, 16), "fp32", seed=1, causal="bottom_right",
                  variants={"indices": "last_keys"}).build()
    verdict = check(_kernel(), case, device="cpu", properties=("poison",))
    assert verdict.status == "PASS" and "poison" in verdict.properties, str(verdict)


def test_indices_of_another_dtype_are_refused_by_name():
    q = torch.zeros(1, 2, 3, 16)
    with pytest.raises(InvalidArgument) as raised:
        _kernel().fn(q, q, q, scale=1.0, indices=torch.zeros(1, 1, 3, 2, dtype=torch.int64))
    assert raised.value.argument == "indices" and "int32" in raised.value.fix


def test_a_key_chosen_by_many_queries_gets_the_sum_of_their_gradients():
    """Every query of 4 heads sharing one K/V head lists keys 2 and 5 (and padding): their dK and dV add up."""
    indices = torch.tensor([2, -1, 5, 2], dtype=torch.int32).expand(1, 1, 6, 4).contiguous()
    case = Recipe(Shapes(1, 4, 1, 6, 8, 16, 16), "fp16", seed=2, causal="bottom_right").build()
    case = dataclasses.replace(case, variant=Variant(indices=indices))
    assert check_backward(_kernel(), case, device="cpu").status == "PASS"
    verdict = check_backward(_kernel("dk_written_not_added"), case, device="cpu")
    assert verdict.status == "BUG" and {f.kind for f in verdict.findings} == {"over_budget"}, str(verdict)


