"""flashcheck's Triton paged kernel under the Triton interpreter: it passes on drawn paged cases (every page
regime: pages of 1, 16, 64, 256 and a size that divides no length, scrambled in a poisoned pool) and on a
batch with empty sequences and NaN in every slot no sequence owns, and each planted bug of the paged form is a
BUG. Its refusals name the argument."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import PAGE_REGIMES, serving_case
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import planted_bugs, resolve_kernel

pytestmark = pytest.mark.interpreter

NAME = "flashcheck:triton-paged"


def _case(packing: str, pages: str = "nondividing"):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 24, generator=gen).half()
    k = torch.randn(3, 2, 40, 24, generator=gen).half()
    v = torch.randn(3, 2, 40, 40, generator=gen).half()
    base = AttentionCase.create(q, k, v, scale=24 ** -0.5, causal="bottom_right")
    return serving_case(base, form="paged", packing=packing, pages=pages, poison="nan", seed=3)


def test_the_paged_kernel_passes_with_nan_in_every_slot_no_sequence_owns():
    verdict = flashcheck.check(NAME, _case("empty_sequences"), device="cpu")
    assert verdict.ok and {"isolation", "page_order"} <= set(verdict.properties), str(verdict)


def test_the_paged_kernel_passes_drawn_cases_of_every_page_regime():
    spec = resolve_kernel(NAME, device="cpu").spec
    drawn = draw_recipes(10, seed=1, spec=spec, max_n=40)
    assert {r.pages for r in drawn} == set(PAGE_REGIMES)
    for recipe in drawn:
        verdict = flashcheck.check(NAME, recipe.build(), device="cpu")
        assert verdict.ok, str(verdict)


@pytest.mark.parametrize("mutant", sorted(planted_bugs(NAME)))
def test_each_planted_bug_is_a_bug(mutant):
    # Pages that divide no length: every sequence crosses a page boundary and leaves its last page part empty.
    verdict = flashcheck.check(f"{NAME}~{mutant}", _case("ragged"), device="cpu", properties=())
    assert verdict.status == "BUG", str(verdict)
    assert "sequence" in verdict.findings[0].diagnosis


def test_refusals_name_the_argument():
    with pytest.raises(InvalidArgument, match="no planted bug 'nope'"):
        resolve_kernel(f"{NAME}~nope", device="cpu")
    inputs = _case("ragged").physical("cpu")
    kernel = resolve_kernel(NAME, device="cpu")
    table = inputs.kwargs["block_table"].long()
    with pytest.raises(InvalidArgument) as info:
        kernel.fn(*inputs.tensors, **{**inputs.kwargs, "block_table": table}, scale=1.0)
    assert info.value.argument == "block_table" and "int32" in info.value.fix
