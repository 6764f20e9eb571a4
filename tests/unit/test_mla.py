"""Multi-head latent attention as a form over the one logical problem (flashcheck.contract.mla,
flashcheck.features.mla): the spec's ``mla`` record and its refusals, drawn cases whose V is K's latent bit for bit
and whose kernel receives the one cached row, the references ``torch:mla`` and ``torch:mla-paged`` within the
budget, each planted misread of the row caught, and a saved case replayed to its verdict."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from flashcheck import InvalidArgument, Kernel, KernelSpec
from flashcheck.contract.mla import MAX_QUERIES, MAX_QUERY_HEADS, MODEL_SCALE, LatentCache
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import load_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.judge.check import check
from flashcheck.kernels.planted import MLA
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.repro.calls import kernel_call
from flashcheck.selftest.config import SelftestConfig
from flashcheck.selftest.run import run_selftest

from tests._planted import first_catching_case

from .test_mla_user_kernel import mla_decode

FORMS = ("torch:mla", "torch:mla-paged")


# ---- the spec -------------------------------------------------------------------------------------------


def test_mla_fixes_the_head_dims_and_heads():
    spec = KernelSpec(mla=True)
    assert spec.mla == LatentCache(512, 64) and spec.head_dims == (576,)
    assert not spec.dv_equals_d and spec.gqa
    assert KernelSpec(mla={"kv_lora_rank": 256, "rope_dim": 32}).head_dims == (288,)
    json.dumps(spec.as_dict())  # a campaign's database keys on it
    one_head = Shapes(1, 128, 1, 1, 9, 576, 512)
    assert spec.unsupported(one_head, dtype="fp16", causal="none", has_mask=False) is None
    two_heads = Shapes(1, 128, 2, 1, 9, 576, 512)
    assert "one KV head" in spec.unsupported(two_heads, dtype="fp16", causal="none", has_mask=False)
    square = Shapes(1, 8, 1, 1, 9, 576, 576)
    assert "Dv=512" in spec.unsupported(square, dtype="fp16", causal="none", has_mask=False)


@pytest.mark.parametrize("fields, argument, words", [
    ({"mla": True, "head_dims": (128,)}, "head_dims", "576"),
    ({"mla": True, "form": "varlen"}, "form", "dense and paged"),
    ({"mla": {"kv_lora_rank": 0, "rope_dim": 64}}, "kv_lora_rank", "at least 1"),
    ({"mla": {"kv_lora_rank": 1000, "rope_dim": 64}}, "mla", "1064"),
    ({"mla": "deepseek"}, "mla", "LatentCache"),
    ({"mla": True, "num_splits": (1, 2)}, "num_splits", "only the paged MLA form"),
])
def test_a_wrong_mla_declaration_names_its_field(fields, argument, words):
    with pytest.raises(InvalidArgument) as raised:
        KernelSpec(**fields)
    assert raised.value.argument == argument and words in str(raised.value)
    assert raised.value.fix


def test_a_paged_mla_kernel_may_declare_split_counts():
    spec = KernelSpec(mla=True, form="paged", num_splits=(1, 2, 16))
    assert spec.num_splits == (1, 2, 16) and spec.head_dims == (576,)


# ---- the cases ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FORMS)
def test_drawn_cases_are_decode_steps_whose_v_is_the_latent_of_k(name):
    spec = resolve_kernel(name, device="cpu").spec
    recipes = draw_recipes(24, spec=spec, seed=3, max_n=32)
    assert {r.dtype for r in recipes} == {"fp16", "bf16", "fp32"}
    for recipe in recipes:
        s = recipe.shapes
        assert s.heads_kv == 1 and s.heads_q <= MAX_QUERY_HEADS and 1 <= s.n_q <= MAX_QUERIES
        assert (s.head_dim, s.head_dim_v) == (576, 512) and recipe.base_scale == MODEL_SCALE
    assert max(r.shapes.heads_q for r in recipes) > 16  # the many query heads of one KV head are drawn
    for recipe in recipes[:6]:
        base = recipe.build()
        base = base if recipe.form == "dense" else base.base
        assert torch.equal(_bits(base.v), _bits(base.k[..., :512]))
        assert abs(base.scale) != 576 ** -0.5


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def test_plain_recipes_keep_their_saved_record():
    plain = draw_recipes(4, spec=KernelSpec(), seed=0)[0]
    assert not plain.shared_kv and plain.base_scale is None
    assert not {"shared_kv", "base_scale"} & set(plain.as_dict())
    assert Recipe.from_dict(plain.as_dict()) == plain


def _recording(paged: bool):
    """A correct MLA kernel that records the tensors it was handed."""
    seen = []
    reference = resolve_kernel("torch:mla-paged" if paged else "torch:mla", device="cpu")

    def kernel(*tensors, **keywords):
        seen.append(tensors)
        return reference.fn(*tensors, **keywords)

    return Kernel(kernel, reference.spec), seen


@pytest.mark.parametrize("paged", [False, True])
def test_the_kernel_receives_q_and_the_one_cached_row(paged):
    kernel, seen = _recording(paged)
    recipe = next(r for r in draw_recipes(8, spec=kernel.spec, seed=1, max_n=32) if r.shapes.n_k > 1)
    verdict = check(kernel, recipe.build(), device="cpu", properties=("determinism",))
    assert verdict.status == "PASS", verdict
    q, kv = seen[0]
    assert q.shape[-1] == kv.shape[-1] == 576
    heads_at, queries_at = (2, 1) if paged else (1, 2)
    assert kv.shape[heads_at] == 1 and q.shape[queries_at] <= MAX_QUERIES and q.shape[heads_at] >= 1
    if paged:
        assert kv.shape[1] in (1, 16, 64)  # (num_blocks, page_size, 1, 576)


# ---- the references within the budget, the planted bugs caught -------------------------------------------


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_two_fp32_dots_summed_stay_within_the_budget_of_one(dtype):
    """torch:mla forms each logit as the latent's dot (512 terms) plus the rope's (64), each in fp32: every product
    carries gamma_513 at most (its dot's roundings and the one addition), inside the budget's gamma_576."""
    kernel = resolve_kernel("torch:mla", device="cpu")
    worst, differ = 0.0, False
    for seed, values in enumerate(("random", "huge_logits", "near_ties", "growing_max")):
        case = Recipe(Shapes(1, 24, 1, 4, 131, 576, 512), dtype, values=values, causal="bottom_right", seed=seed,
                      shared_kv=True, base_scale=MODEL_SCALE).build()
        verdict = check(kernel, case, device="cpu", properties=())
        assert verdict.status == "PASS", verdict
        worst = max(worst, verdict.max_ratio)
        q, k = case.q.float(), case.k.float()
        split = q[..., :512] @ k[..., :512].transpose(-1, -2) + q[..., 512:] @ k[..., 512:].transpose(-1, -2)
        differ |= not torch.equal(split, q @ k.transpose(-1, -2))
    assert differ  # the two dots round otherwise than one: the budget was put to the test
    assert 0.0 < worst < 1.0


@pytest.mark.parametrize("name", FORMS)
@pytest.mark.parametrize("bug", [b.name for b in MLA])
def test_each_misread_of_the_row_is_caught_within_40_cases(name, bug):
    kernel = resolve_kernel(f"{name}~{bug}", device="cpu")
    assert first_catching_case(kernel, max_n=64) is not None, f"{kernel.name} passed 40 cases"


@pytest.mark.parametrize("name", FORMS)
def test_a_saved_case_replays_to_its_verdict(name, tmp_path):
    buggy = resolve_kernel(f"{name}~drops_rope", device="cpu")
    recipe = draw_recipes(1, spec=buggy.spec, seed=0, max_n=32)[0]
    case = recipe.build(kernel=buggy.name)
    first = check(buggy, case, device="cpu", properties=())
    assert first.status == "BUG"
    case.save(tmp_path / "mla")
    loaded = load_case(tmp_path / "mla.json")
    again = check(buggy, loaded, device="cpu", properties=())
    assert again.status == "BUG" and again.max_ratio == first.max_ratio
    assert loaded.provenance["recipe"]["shared_kv"] is True
    assert check(name, loaded, device="cpu", properties=()).status == "PASS"


def test_the_selftest_rows_of_torch_mla_catch_each_planted_bug():
    names = ("torch:mla",) + tuple(f"torch:mla~{bug.name}" for bug in MLA)
    rows = run_selftest(SelftestConfig("cpu", ("fp32",), cases=2, bug_cases=4, max_n=32, names=names))
    assert [r.variant for r in rows] == list(names)
    assert rows[0].cases == 2 and rows[0].flashcheck.false_alarms == 0
    assert all(r.flashcheck.first_case is not None for r in rows[1:]), [r.as_dict() for r in rows]


def test_a_reproducer_of_an_mla_case_is_refused_by_name(tmp_path):
    case = draw_recipes(1, spec=mla_decode.spec, seed=0, max_n=16)[0].build()
    with pytest.raises(InvalidArgument) as raised:
        kernel_call(mla_decode, case, device="cpu", case_path=tmp_path / "case.json")
    assert raised.value.argument == "case" and "one cached row" in str(raised.value)


def test_heavy_rope_poisons_the_columns_v_must_not_read_and_keeps_the_logits():
    plain = Recipe(Shapes(1, 4, 1, 2, 33, 576, 512), "fp32", seed=5, shared_kv=True, base_scale=MODEL_SCALE)
    heavy = dataclasses.replace(plain, form_values="heavy_rope")
    a, b = plain.build(), heavy.build()
    assert torch.equal(b.v, a.v) and torch.equal(b.k[..., 512:], a.k[..., 512:] * 256)
    logits = [c.q.double() @ c.k.double().transpose(-1, -2) for c in (a, b)]
    assert torch.equal(*logits)  # each product q_d k_d is the plain case's, exactly
    ratios = [check("torch:mla~values_from_rope_end", c, device="cpu", properties=(), envelope=False).max_ratio
              for c in (a, b)]
    assert ratios[1] > 64 * ratios[0] > 64
    assert check("torch:mla", b, device="cpu", properties=()).status == "PASS"
    assert "heavy_rope" in heavy.regime and Recipe.from_dict(heavy.as_dict()) == heavy
