"""Time to the first case: the summary's ``first_case_s``, in one process, over ``--jobs`` and in a merge."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from flashcheck.cli import main

from .test_cli import K, fuzz
from .test_merge import combined

ROOT = Path(__file__).resolve().parents[2]


def _command() -> list:
    script = shutil.which("flashcheck", path=str(Path(sys.executable).parent))
    return [sys.executable, script] if script else [sys.executable, "-m", "flashcheck.cli"]


def test_first_case_s_counts_from_the_process_start(tmp_path):
    # A process of its own: first_case_s counts from its start, imports and worker start included.
    summary_path = tmp_path / "summary.json"
    started = time.monotonic()
    run = subprocess.run(_command() + ["fuzz", "torch:math", "--device", "cpu", "--max-examples", "3", "--seed", "0",
                                       "--no-progress", "--corpus", str(tmp_path / "corpus"), "--json",
                                       str(summary_path)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    waited = time.monotonic() - started
    assert run.returncode == 0, run.stderr
    summary = json.loads(summary_path.read_text())
    first, elapsed = summary["first_case_s"], summary["elapsed_s"]
    # the campaign's clock starts once the worker is ready, after the start-up; the first case ends within both
    assert 0 < first <= waited and elapsed <= waited
    assert first > 0.1  # counted from the process's start: importing torch alone takes longer
    assert f"first judged case {first:g} s after start" in run.stdout


def test_first_case_s_in_process_and_without_isolation(tmp_path):
    # main(argv) called from Python counts from the call
    for extra in ([], ["--no-isolation"]):
        started = time.monotonic()
        code, summary = fuzz(tmp_path, "correct", "--max-examples", "3", *extra)
        waited = time.monotonic() - started
        assert code == 0 and 0 < summary["first_case_s"] <= waited, summary["first_case_s"]


def test_first_case_s_without_a_judged_case_is_none(tmp_path):
    code, summary = fuzz(tmp_path, "always_out_of_memory", "--max-examples", "2")
    assert code == 3 and summary["first_case_s"] is None


def test_first_case_s_merges_as_the_earliest(tmp_path):
    code, summary = fuzz(tmp_path, "correct", "--max-examples", "2")
    assert code == 0
    late, early, none = (dict(summary, first_case_s=value) for value in (7.5, 2.25, None))
    merged = combined([late, early, none], sources=["late", "early", "none"])
    assert merged["first_case_s"] == 2.25
    assert [s["first_case_s"] for s in merged["sources"]] == [7.5, 2.25, None]
    assert combined([none, none])["first_case_s"] is None
    # a merge of merges: still the earliest
    assert combined([merged, dict(summary, first_case_s=1.0)])["first_case_s"] == 1.0


def test_first_case_s_over_jobs(tmp_path, capsys):
    out = tmp_path / "jobs.json"
    started = time.monotonic()
    code = main(["fuzz", f"{K}:correct", "--device", "cpu", "--preset", "smoke", "--seed", "1", "--jobs", "2",
                 "--max-examples", "4", "--corpus", str(tmp_path / "corpus"), "--json", str(out), "--no-progress"])
    waited = time.monotonic() - started
    summary = json.loads(out.read_text())
    assert code == 0 and summary["jobs"] == 2
    each = [s["first_case_s"] for s in summary["sources"]]
    assert all(0 < x <= waited for x in each) and summary["first_case_s"] == min(each)
    assert "first judged case" in capsys.readouterr().out
