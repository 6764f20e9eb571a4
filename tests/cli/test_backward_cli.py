"""flashcheck fuzz --backward: campaigns on the backward pass, their saved cases and their replay."""

from __future__ import annotations

import json

from flashcheck.cli import main

from ..robustness._run import fuzz


def test_a_correct_backward_passes_and_the_summary_says_backward(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "differentiable", "--backward", "--max-examples", "25")
    assert code == 0 and summary["verdict"] == "PASS" and summary["backward"] is True
    assert summary["cases"] >= 25 and summary["properties"]["checked"] == []  # the forward's properties: not run
    by_gradient = summary["max_ratio_by_gradient"]  # the largest err/budget of each gradient, per dtype
    assert set(by_gradient) == set(summary["max_ratio_by_dtype"])
    for dtype, ratios in by_gradient.items():
        assert {"dq", "dk", "dv"} <= set(ratios) and max(ratios.values()) == summary["max_ratio_by_dtype"][dtype]
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("backward pass: PASS"), out
    dtype, ratios = next(iter(by_gradient.items()))
    assert f"(dq {ratios['dq']:.3g}, dk {ratios['dk']:.3g}, dv {ratios['dv']:.3g})" in out


def test_a_backward_bug_is_saved_with_its_do_and_replays_as_a_backward_case(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "dq_unscaled", "--backward", "--max-examples", "60")
    assert code == 1 and summary["verdict"] == "BUG"
    finding = summary["findings"][0]
    assert finding["kinds"] == ["over_budget"] and "dq over its budget" in " ".join(finding["diagnosis"])
    saved = json.loads(open(finding["path"].replace(".npz", ".json")).read())
    assert saved["provenance"]["pass"] == "backward" and saved["provenance"]["upstream"]
    capsys.readouterr()
    assert main(["replay", finding["path"], "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "dq over its budget" in out and ", dO " in out


def test_backward_on_a_kernel_without_one_is_a_usage_error(tmp_path, capsys):
    code = main(["fuzz", "tests.robustness._kernels:correct", "--backward", "--device", "cpu", "--preset", "smoke",
                 "--corpus", str(tmp_path), "--no-progress"])
    assert code == 2
    assert "declares no backward pass" in capsys.readouterr().err


def test_backward_campaigns_spread_over_jobs(tmp_path):
    code, summary = fuzz(tmp_path, "differentiable", "--backward", "--max-examples", "12", "--jobs", "2")
    assert code == 0 and summary["backward"] is True and summary["jobs"] == 2 and summary["cases"] >= 12
