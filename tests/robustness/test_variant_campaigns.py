"""Campaigns on kernels with variants: a correct PyTorch kernel with soft-capping, windows, chunks and sinks
passes an adversarial campaign; copies of it wrong in one feature each are found, their diagnosis naming
the defect (examples/variants/variant_kernels.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.inputs.presets import load_preset

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "variants" / "variant_kernels.py"


def _kernels():
    spec = importlib.util.spec_from_file_location("variant_kernels", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


KERNELS = _kernels()


def _campaign(kernel, tmp_path, **options):
    return run_campaign(CampaignConfig(Target(kernel, "cpu", load_preset("adversarial"))).replace(
        seed=1, corpus=tmp_path, database=tmp_path / "db", isolate=False, **options))


def test_a_correct_kernel_with_every_variant_passes(tmp_path):
    result = _campaign(KERNELS.correct, tmp_path, max_examples=40)
    summary = result.as_dict()
    assert summary["verdict"] == "PASS", summary["findings"]
    judged = result.coverage
    for feature in ("softcap", "window", "chunk", "sinks"):
        used = {value for per_dtype in judged.values() for value in per_dtype.get(feature, {}) if value != "none"}
        assert used, f"no case used {feature}"


# window_short is README.md's example: its fuzz command, seed 1 on the adversarial preset, is documented to say
# BUG with "(the window's left edge) left out", and test_documented_commands_in_a_fresh_clone runs it.
@pytest.mark.parametrize("name,named", [
    ("cap_unscaled", ("the cap applied to the unscaled logits", "(softcap ignored)")),
    ("sinks_ignored", ("(sink ignored)",)),
])
def test_a_kernel_wrong_in_one_feature_is_found(tmp_path, name, named):
    result = _campaign(getattr(KERNELS, name), tmp_path, max_examples=200)
    summary = result.as_dict()
    assert summary["verdict"] == "BUG"
    diagnoses = " ".join(" ".join(f["diagnosis"]) for f in summary["findings"])
    assert any(text in diagnoses for text in named), diagnoses


def test_a_backward_that_drops_the_cap_s_slope_is_found(tmp_path):
    kernel = KERNELS.cap_slope_dropped
    assert _campaign(kernel, tmp_path / "forward", max_examples=20).as_dict()["verdict"] == "PASS"
    summary = _campaign(kernel, tmp_path / "backward", max_examples=200, backward=True).as_dict()
    assert summary["verdict"] == "BUG"
    assert all("softcap=" in f["case"] and "gradients" in f["cause"] for f in summary["findings"]), summary["findings"]
