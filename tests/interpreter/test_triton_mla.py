"""flashcheck's Triton MLA kernel under the Triton interpreter: absorbed decode over a paged cache of [latent | rope]
rows, split-KV partial states and their Triton merge, judged at every split count of its spec. It passes drawn cases
of each page size in fp16 and fp32, and a batch with empty sequences and NaN in every slot no sequence owns under the
serving properties; each planted bug (torch:mla's four misreads of the row, and empty splits that leave a reused
workspace's stale state to the merge) is caught within 40 drawn cases. Shapes stay small: the interpreter pays for
every program of every split."""

from __future__ import annotations

import pytest

import flashcheck
from flashcheck.cli.main import main
from flashcheck.contract.mla import MODEL_SCALE
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.judge.check import check
from flashcheck.kernels.mla import PAGE_SIZES
from flashcheck.kernels.planted import TRITON_MLA
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.triton.mla import SPLIT_COUNTS

from tests._planted import first_catching_case

pytestmark = pytest.mark.interpreter

NAME = "flashcheck:triton-mla"


def _cost(recipe: Recipe) -> int:
    s = recipe.shapes
    return s.batch * s.heads_q * s.n_q * (s.n_k + 32)


def test_the_kernel_passes_drawn_cases_of_every_page_size_in_fp16_and_fp32():
    kernel = resolve_kernel(NAME, device="cpu")
    assert kernel.spec.num_splits == SPLIT_COUNTS and kernel.spec.page_sizes == PAGE_SIZES
    assert kernel.spec.dtypes == ("fp16", "fp32")  # the interpreter's bf16 tl.dot is wrong: left out on the CPU
    cheapest = {}
    for recipe in draw_recipes(40, spec=kernel.spec, seed=2, max_n=40):
        key = (recipe.pages, recipe.dtype)
        if key not in cheapest or _cost(recipe) < _cost(cheapest[key]):
            cheapest[key] = recipe
    assert set(cheapest) == {(str(p), d) for p in PAGE_SIZES for d in ("fp16", "fp32")}
    for recipe in cheapest.values():
        verdict = check(kernel, recipe.build(), device="cpu", properties=())
        assert verdict.status == "PASS", verdict


@pytest.mark.parametrize("pages", [str(p) for p in PAGE_SIZES])
def test_the_kernel_stays_within_the_budget_at_each_page_size(pages):
    """Near ties in fp16 (P's rounding and the output's at work) and random values in fp32, ragged sequences."""
    kernel = resolve_kernel(NAME, device="cpu")
    for dtype, values in (("fp16", "near_ties"), ("fp32", "random")):
        recipe = Recipe(Shapes(2, 8, 1, 3, 45, 576, 512), dtype, values=values, causal="bottom_right", seed=1,
                        packing="ragged", pages=pages, poison="huge", form="paged", shared_kv=True,
                        base_scale=MODEL_SCALE)
        verdict = check(kernel, recipe.build(), device="cpu", properties=())
        assert verdict.status == "PASS", verdict
        assert dtype == "fp32" or verdict.max_ratio > 0.1


def test_the_kernel_keeps_the_serving_properties_with_nan_where_no_sequence_owns():
    recipe = Recipe(Shapes(3, 6, 1, 2, 21, 576, 512), "fp16", causal="bottom_right", seed=5, packing="empty_sequences",
                    pages="16", poison="nan", form="paged", shared_kv=True, base_scale=MODEL_SCALE)
    verdict = flashcheck.check(NAME, recipe.build(), device="cpu")
    assert verdict.ok and {"isolation", "page_order", "batch"} <= set(verdict.properties), str(verdict)


@pytest.mark.parametrize("bug", [b.name for b in TRITON_MLA])
def test_each_planted_bug_is_caught_within_40_cases(bug):
    kernel = resolve_kernel(f"{NAME}~{bug}", device="cpu")
    assert first_catching_case(kernel, max_n=32) is not None, f"{kernel.name} passed 40 cases"


def test_the_kernel_is_listed_with_its_planted_bugs(capsys):
    assert main(["kernels"]) == 0
    listing = capsys.readouterr().out
    assert NAME in listing and "merges_empty_splits" in listing
