"""Cases drawn on a CUDA GPU (what campaigns there do): kept there (the variant's tensors on the CPU), the same
numbers on every draw of a recipe, the recipe's shapes, dtype and regime, every feature of the preset included,
marked as drawn there; and a campaign's finding, drawn in its worker process, is saved with the very case the
worker judged, drawn on the GPU by default and on the host with FLASHCHECK_DRAW=host."""

from __future__ import annotations

import json
import re

import pytest
import torch

import flashcheck
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.features.variant import TENSORS as VARIANT_TENSORS
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import resolve_kernel
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

PRESET_KERNELS = [("adversarial", "torch:math"), ("smoke", "torch:math"), ("long-context", "torch:math")]


def _recipes(preset: str, kernel: str, count: int):
    spec = resolve_kernel(kernel, device="cuda").spec
    options = load_preset(preset).strategy_options()
    return draw_recipes(count, seed=3, spec=spec, **options)


def _structure(case: AttentionCase) -> tuple:
    """What a recipe fixes whatever device draws it: the description less the drawn values it lists
    (ALiBi slopes, sinks), and every tensor's shape, dtype and strides."""
    shown = re.sub(r"\[[^\]]*\]", "[..]", case.describe())
    return shown, [(t.shape, t.dtype, t.stride()) for t in _tensors(case)]


def _tensors(case: AttentionCase) -> list[torch.Tensor]:
    found = [case.q, case.k, case.v, case.attn_mask, *case.variant.kwargs().values()]
    return [t for t in found if isinstance(t, torch.Tensor)]


@pytest.mark.parametrize("preset,kernel", PRESET_KERNELS)
def test_a_recipe_drawn_on_the_gpu_is_the_recipe_kept_there(preset, kernel):
    recipes = [r for r in _recipes(preset, kernel, 120) if r.elements == "none"][:80]
    regimes = set()
    for recipe in recipes:
        on_cpu, on_gpu, again = (recipe.build(draw_on=d) for d in ("cpu", "cuda", "cuda"))
        assert _structure(on_gpu) == _structure(on_cpu), recipe
        dense = on_gpu.base if recipe.form != "dense" else on_gpu  # a serving form is packed on the host
        want = "cpu" if recipe.form != "dense" else "cuda"
        kept = [t for t in (dense.q, dense.k, dense.v, dense.attn_mask) if t is not None]
        assert {t.device.type for t in kept} == {want}, recipe
        assert all(getattr(dense.variant, t) is None or getattr(dense.variant, t).device.type == "cpu"
                   for t in VARIANT_TENSORS), recipe
        assert on_gpu.equal_bits(again), f"two draws of {recipe} differ"
        assert on_gpu.provenance["strategy"] == recipe.regime
        assert on_gpu.provenance["drawn_on"] == "cuda" and "drawn_on" not in on_cpu.provenance
        regimes.add(recipe.values)
    # the covering order meets the value regimes first: the preset's own, else at least eight
    assert len(regimes) >= len(load_preset(preset).strategy_options().get("value_regimes") or range(8))


def test_cases_drawn_on_the_gpu_pass_a_correct_kernel():
    kernel = resolve_kernel("torch:math", device="cuda")
    verdicts = [flashcheck.check(kernel, r.build(draw_on="cuda"), device="cuda")
                for r in _recipes("adversarial", "torch:math", 60)]
    failed = [(v.case, [f.diagnosis for f in v.findings]) for v in verdicts if v.status != "PASS"]
    assert not failed, failed[:3]


@pytest.mark.parametrize("draw", [None, "host"])
def test_a_finding_drawn_in_the_worker_is_saved_with_the_case_it_judged(tmp_path, monkeypatch, draw):
    if draw is not None:
        monkeypatch.setenv("FLASHCHECK_DRAW", draw)  # the worker process inherits it
    result = run_campaign(CampaignConfig(Target("tests.cli._planted:tail_bug", "cuda", load_preset("smoke"))).replace(
        max_examples=200, seed=2, corpus=tmp_path))
    assert result.verdict == "BUG" and result.time_split["generation"] > 0
    found = [f for f in result.findings if not f["shrunk"]]
    assert found, result.findings
    where = "cpu" if draw == "host" else "cuda"
    for entry in result.findings:
        case = AttentionCase.load(entry["path"])
        assert case.device.type == "cpu" and case.provenance.get("drawn_on", "cpu") == where, entry["path"]
        recipe = Recipe.from_dict(json.loads(json.dumps(case.provenance["recipe"])))
        assert case.equal_bits(recipe.build(draw_on=where)), entry["path"]
        replayed = flashcheck.check(resolve_kernel("tests.cli._planted:tail_bug", device="cuda"), case,
                                    device="cuda")
        assert replayed.status == "BUG"
