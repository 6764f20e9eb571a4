"""The flashcheck command: exit codes, JSON summary, corpus, replay."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from flashcheck.cli import main

K = "tests.cli._planted"


def fuzz(tmp_path, kernel, *extra):
    out = tmp_path / "summary.json"
    code = main(["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", "1",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(out), "--no-progress", *extra])
    return code, json.loads(out.read_text())


def test_correct_kernel_passes_with_exit_0(tmp_path):
    code, summary = fuzz(tmp_path, "correct", "--max-examples", "30")
    assert code == 0 and summary["verdict"] == "PASS" and summary["findings"] == []
    assert summary["cases"] == 30 and summary["cases_per_s"] > 0
    assert sum(summary["counts"]["by_dtype"].values()) == 30
    split = summary["time_split_s"]
    assert set(split) == {"draw", "generation", "transfer", "kernel", "compile", "oracle", "properties", "envelope",
                          "triage", "anchors", "models"}
    assert split["models"] == 0  # no bug to name
    assert split["draw"] > 0 and split["generation"] > 0  # the worker draws the tensors, hypothesis the recipe
    assert split["anchors"] == 0  # the field's rules are a sign-off's cost, not a campaign's
    # which cases get the properties depends on their time (campaign/share.py): the info counts those that did
    batch = summary["properties"]["cases"].get("batch", 0)
    assert summary["info"]["batch_checked"] == batch and summary["info"]["batch_dependent"] == 0


def test_planted_bug_exits_1_saves_and_replays(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "tail_bug", "--max-examples", "200")
    assert code == 1 and summary["verdict"] == "BUG"
    shrunk = [f for f in summary["findings"] if f["shrunk"]]
    assert len(shrunk) == 1 and shrunk[0]["kinds"] == ["over_budget"]
    assert any(f["shrunk"] is False for f in summary["findings"]), "the case as first found is saved too"
    for finding in summary["findings"]:
        assert finding["replay"] == f"flashcheck replay {finding['path']} --device cpu"
        capsys.readouterr()
        assert main(["replay", finding["path"], "--device", "cpu"]) == 1
        assert "over_budget" in capsys.readouterr().out
    # hypothesis shrinks to the smallest failing recipe: 33 rows, one head
    assert "Nq=33" in shrunk[0]["case"], shrunk[0]["case"]


def test_crash_is_a_bug_finding(tmp_path):
    code, summary = fuzz(tmp_path, "crashes", "--max-examples", "5")
    assert code == 1 and {"crash"} == set(summary["findings"][-1]["kinds"])


def test_time_budget_stops_the_campaign(tmp_path):
    code, summary = fuzz(tmp_path, "correct", "--max-examples", "100000", "--time-budget", "2")
    assert code == 0 and summary["stopped"] == "time_budget" and summary["elapsed_s"] < 30


def test_plain_callable_gets_the_default_spec(tmp_path):
    code, summary = fuzz(tmp_path, "plain", "--max-examples", "10")
    assert code == 0


@pytest.mark.parametrize("args, words", [
    (["fuzz", "torch:nonesuch", "--device", "cpu"], "torch:nonesuch"),
    (["fuzz", f"{K}:correct", "--device", "cpu", "--preset", "nonesuch"], "preset"),
    (["fuzz", f"{K}:missing", "--device", "cpu"], "missing"),
    (["replay", "/nonexistent/case.json", "--device", "cpu"], "nonexistent"),
])
def test_usage_errors_exit_2_and_name_the_culprit(args, words, capsys):
    assert main(args) == 2
    assert words in capsys.readouterr().err


def test_unknown_dtype_exits_2():
    result = subprocess.run([sys.executable, "-m", "flashcheck.cli", "fuzz", "torch:math", "--dtype", "fp8"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "fp8" in result.stderr


def test_kernels_and_presets_listings(capsys):
    assert main(["kernels"]) == 0 and "flashcheck:triton" in capsys.readouterr().out
    assert main(["presets"]) == 0 and "smoke" in capsys.readouterr().out
