"""Where a campaign draws its cases: on its GPU unless FLASHCHECK_DRAW=host, on the CPU for a CPU campaign, and
an unknown value refused as a usage error; a case drawn elsewhere than the CPU says so, and is saved and pickled
from the CPU (GPU drawing itself: tests/gpu/test_drawing_gpu.py)."""

from __future__ import annotations

import pickle

import pytest
import torch

from flashcheck.cli import main
from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.drawing import draw_device, drawn_on
from flashcheck.inputs.recipe import Recipe


@pytest.mark.parametrize("device, value, expected", [
    ("cuda", None, "cuda"), ("cuda:1", None, "cuda:1"), ("cuda:1", "device", "cuda:1"), ("cuda", "host", "cpu"),
    ("cpu", None, "cpu"), ("cpu", "device", "cpu"),
])
def test_a_gpu_campaign_draws_on_its_gpu_unless_told_host(device, value, expected, monkeypatch):
    if value is None:
        monkeypatch.delenv("FLASHCHECK_DRAW", raising=False)
    else:
        monkeypatch.setenv("FLASHCHECK_DRAW", value)
    assert draw_device(device) == expected


def test_an_unknown_place_to_draw_is_refused_with_the_fix(monkeypatch):
    monkeypatch.setenv("FLASHCHECK_DRAW", "gpu")
    with pytest.raises(InvalidArgument, match=r"FLASHCHECK_DRAW='gpu'.*FLASHCHECK_DRAW=host"):
        draw_device("cuda")


def test_an_unknown_place_to_draw_is_a_usage_error_before_any_case(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLASHCHECK_DRAW", "gpu")
    assert main(["fuzz", "tests.cli._planted:correct", "--device", "cpu", "--max-examples", "2"]) == 2
    assert "FLASHCHECK_DRAW='gpu'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_case_drawn_on_the_cpu_records_no_other_generator():
    case = Recipe(Shapes(1, 2, 2, 8, 8, 16, 16), "fp16", seed=3).build()
    assert "drawn_on" not in case.provenance and case.device.type == "cpu"
    assert drawn_on(case.q) == {}
    assert case.on("cpu") is case
    again = pickle.loads(pickle.dumps(case))
    assert again.equal_bits(case) and again.device.type == "cpu"


def test_a_case_keeps_its_tensors_where_they_were_given_and_copies_them():
    q = torch.randn(1, 1, 4, 8, dtype=torch.float16, device="meta")
    assert drawn_on(q) == {"drawn_on": "meta"}
    given = torch.randn(1, 1, 4, 8, dtype=torch.float16)
    case = AttentionCase.create(given, given, given, scale=0.5)
    given.zero_()  # the caller's tensor changes; the case does not
    assert bool(case.q.abs().sum() > 0) and case.q.is_contiguous()


def _out_of_gpu_memory(monkeypatch):
    """drawn_case failing with CUDA's out-of-memory error wherever it draws on a GPU."""
    from flashcheck.campaign import worker_child

    drawn = worker_child.drawn_case

    def drawing(recipe, *, device, draw_on=None, **kw):
        if draw_on is None:  # the campaign's own drawing device (this machine has no GPU: any device stands in)
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB.")
        return drawn(recipe, device=device, draw_on=draw_on, **kw)

    monkeypatch.setattr(worker_child, "drawn_case", drawing)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)  # no CUDA on this machine


def test_a_case_too_large_for_its_gpu_is_drawn_on_the_host(monkeypatch):
    from flashcheck.campaign.worker_child import drawn_or_skipped

    _out_of_gpu_memory(monkeypatch)
    recipe = Recipe(Shapes(1, 2, 2, 8, 8, 16, 16), "fp16", seed=3)
    case, skipped = drawn_or_skipped(recipe, kernel="k", device="cuda", backward=False)
    assert skipped is None and case.device.type == "cpu" and "drawn_on" not in case.provenance
    assert case.equal_bits(recipe.build())


def test_a_case_too_large_for_its_gpu_and_the_host_is_skipped_not_a_failure(tmp_path, monkeypatch):
    from flashcheck.campaign import run as campaign_run
    from flashcheck.campaign.config import CampaignConfig, Target
    from flashcheck.campaign.worker_child import drawn_or_skipped
    from flashcheck.inputs import sizes
    from flashcheck.inputs.presets import load_preset

    _out_of_gpu_memory(monkeypatch)
    monkeypatch.setattr(sizes, "available_host_bytes", lambda: 1)  # nothing fits on the host either
    recipe = Recipe(Shapes(1, 2, 2, 8, 8, 16, 16), "fp16", seed=3)
    case, skipped = drawn_or_skipped(recipe, kernel="k", device="cuda", backward=False)
    assert case is None and skipped.skipped.startswith("oom: drawing the case on the GPU")
    assert "on the host: drawing the case takes" in skipped.skipped

    # a campaign that draws on a GPU (it says so: this machine has none) counts such cases as skips
    monkeypatch.setattr(campaign_run, "draw_device", lambda device: "cuda")
    result = campaign_run.run_campaign(CampaignConfig(Target("tests.cli._planted:correct", "cpu",
                                                             load_preset("smoke"))).replace(
        max_examples=10, seed=1, corpus=tmp_path, isolate=False))
    summary = result.as_dict()
    assert summary["verdict"] == "NO_CASES" and summary["stopped"] == "max_examples", summary["notes"]
    assert summary["skipped"] == {"oom": 10} and not summary["findings"], summary["skipped"]
