"""Block-sparse lists (spec ``block_sparse``): the convention's declarations refused by name, the visible keys read
from the lists (against a brute force written here, entry by entry) with full blocks masked and trusted, the oracle
and the gradients audited by mpmath, torch:block-sparse within the budget, each planted misread caught within 40
cases, and a saved case replayed."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck import BlockLists, BlockSparse, InvalidArgument, KernelSpec
from flashcheck.contract.validation import Shapes
from flashcheck.features.block_lists import REGIMES
from flashcheck.inputs.case import load_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.judge.backward import check_backward
from flashcheck.judge.check import check
from flashcheck.kernels.planted import BLOCK_SPARSE
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.oracle import reference_attention

from tests._planted import first_catching_case

DRAWN = [r for r in REGIMES if r != "none"]
SHAPES = Shapes(2, 4, 2, 37, 70, 8, 8)


def _recipe(regime: str, *, trusted: bool = False, causal: str = "bottom_right", seed: int = 3, dtype="fp32",
            shapes=SHAPES) -> Recipe:
    return Recipe(shapes, dtype, seed=seed, causal=causal, variants={"block_lists": regime},
                  settings={"block_size": "16x32", "full_blocks": "trusted" if trusted else "masked"})


@pytest.mark.parametrize("fields, argument", [
    ({"q_block": 0}, "q_block"), ({"full_blocks": "skipped"}, "full_blocks"), ({"required": 1}, "required")])
def test_a_wrong_declaration_names_its_field(fields, argument):
    with pytest.raises(InvalidArgument) as raised:
        KernelSpec(block_sparse=fields)
    assert raised.value.argument == argument


def test_counts_past_the_list_width_are_refused():
    with pytest.raises(InvalidArgument) as raised:
        BlockLists(torch.tensor([[[3]]]), torch.zeros(1, 1, 1, 2, dtype=torch.int32), 16, 16)
    assert raised.value.argument == "kv_num_blocks"


def _brute_force(lists: BlockLists, causal: str, n_q: int, n_k: int, heads_q: int, batch: int) -> torch.Tensor:
    """(B, Hq, Nq, Nk): key j visible to query i when the first count entries of i's block's row name j's block
    (and the causal alignment shows it), or a full list names it (shown whole when trusted)."""
    out = torch.zeros(batch, heads_q, n_q, n_k, dtype=torch.bool)
    for b in range(batch):
        for h in range(heads_q):
            for i in range(n_q):
                last = {"none": n_k - 1, "top_left": i, "bottom_right": i + n_k - n_q}[causal]
                for full, (num, idx) in enumerate(lists.lists()):
                    row = (min(b, num.shape[0] - 1), min(h, num.shape[1] - 1), i // lists.q_block)
                    for blk in idx[row][:int(num[row])].tolist():
                        for j in range(blk * lists.kv_block, min(n_k, (blk + 1) * lists.kv_block)):
                            out[b, h, i, j] |= j <= last or bool(full and lists.trusted)
    return out


@pytest.mark.parametrize("trusted", [False, True])
@pytest.mark.parametrize("regime", DRAWN)
def test_the_visible_keys_are_the_listed_blocks(regime, trusted):
    case = _recipe(regime, trusted=trusted).build()
    s = case.shapes
    want = _brute_force(case.variant.block_lists, case.causal, s.n_q, s.n_k, s.heads_q, s.batch)
    assert torch.equal(case.visible(), want)
    ref = reference_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal, variant=case.variant)
    assert torch.equal(ref.empty_rows, ~want.any(-1))


def test_the_kernel_receives_flex_keywords():
    case = _recipe("full_lists").build()
    kwargs = case.variant.kwargs("cpu")
    assert set(kwargs) == {"kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices"}
    assert kwargs["kv_indices"].dtype == torch.int32 and kwargs["kv_num_blocks"].shape[2] == math.ceil(37 / 16)


def test_one_head_of_the_lists_is_cut_with_its_head():
    case = _recipe("sampled", seed=8).build()
    lists = case.variant.block_lists
    cut = case.variant.select(slice(1, 2), slice(2, 3), group=case.shapes.group).block_lists
    if lists.kv_num_blocks.shape[1] > 1:
        assert torch.equal(cut.kv_indices, lists.kv_indices[1:2, 2:3])
    assert cut.kv_num_blocks.shape[:2] in ((1, 1),)


@pytest.mark.parametrize("regime", ["sampled", "tail_block", "full_lists"])
@pytest.mark.parametrize("trusted", [False, True])
def test_the_oracle_is_audited_by_mpmath(regime, trusted):
    case = _recipe(regime, trusted=trusted, dtype="fp16", shapes=Shapes(1, 2, 1, 20, 40, 8, 8)).build()
    audit = audit_reference(case.q, case.k, case.v, scale=case.scale, causal=case.causal, variant=case.variant,
                            dps=30)
    assert audit.ok, audit


def test_the_gradients_are_audited_by_mpmath():
    from flashcheck.inputs.regimes import make_upstream
    from flashcheck.numerics.gradients import audit_gradients

    case = _recipe("full_lists", trusted=True, dtype="fp16", shapes=Shapes(1, 2, 1, 17, 33, 8, 8)).build()
    kw = dict(scale=case.scale, causal=case.causal, variant=case.variant)
    do = make_upstream("random", out=reference_attention(case.q, case.k, case.v, **kw).out, dtype=case.q.dtype, seed=1)
    assert audit_gradients(case.q, case.k, case.v, do, dps=30, **kw).ok


@pytest.mark.parametrize("name", ["torch:block-sparse", "torch:block-sparse[full_blocks=trusted]"])
def test_torch_block_sparse_passes_its_own_cases_forward_and_backward(name):
    kernel = resolve_kernel(name, device="cpu")
    worst = 0.0
    for index, recipe in enumerate(draw_recipes(24, spec=kernel.spec, seed=2, max_n=72)):
        case = recipe.build()
        verdict = check(kernel, case, device="cpu", properties=())
        assert verdict.status == "PASS", verdict
        worst = max(worst, verdict.max_ratio)
        if index % 4 == 0:
            backward = check_backward(kernel, case, device="cpu")
            assert backward.status == "PASS" or backward.skipped, backward
    assert 0.0 < worst <= 1.0


@pytest.mark.parametrize("bug", [b.name for b in BLOCK_SPARSE])
def test_each_misread_of_the_lists_is_caught_within_40_cases(bug):
    kernel = resolve_kernel(f"torch:block-sparse~{bug}", device="cpu")
    assert first_catching_case(kernel, properties=("poison",), max_n=72) is not None, f"{kernel.name} passed 40 cases"


def test_a_saved_case_replays_to_its_verdict(tmp_path):
    buggy = resolve_kernel("torch:block-sparse~full_list_trusted", device="cpu")
    case = _recipe("full_lists", seed=5, dtype="bf16").build(kernel=buggy.name)
    first = check(buggy, case, device="cpu", properties=())
    assert first.status == "BUG"
    case.save(tmp_path / "blocks")
    loaded = load_case(tmp_path / "blocks.json")
    assert loaded.variant.block_lists == case.variant.block_lists
    again = check(buggy, loaded, device="cpu", properties=())
    assert again.status == "BUG" and again.max_ratio == first.max_ratio
    assert check("torch:block-sparse", loaded, device="cpu", properties=()).status == "PASS"


def test_a_case_for_other_blocks_is_refused_by_name():
    case = Recipe(SHAPES, "fp32", seed=1, variants={"block_lists": "sampled"},
                  settings={"block_size": "64x64", "full_blocks": "masked"}).build()
    with pytest.raises(InvalidArgument) as raised:
        check("torch:block-sparse", case, device="cpu")
    assert "16x32" in str(raised.value) and "64x64" in str(raised.value)


def test_full_blocks_a_spec_declares_none_of_are_refused():
    spec = KernelSpec(block_sparse=BlockSparse(16, 32, "none"))
    assert spec.block_sparse.full_blocks == "none"
    recipes = draw_recipes(30, spec=spec, seed=0, max_n=64)
    assert all(r.block_lists != "full_lists" for r in recipes)
    assert all(r.block_lists != "none" for r in recipes)  # required: never drawn without
