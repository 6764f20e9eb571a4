"""Ctrl-C or SIGTERM mid-campaign: the summary is written, the corpus kept, the exit code says what was found.

Each test starts ``flashcheck fuzz`` as a subprocess of its own, through the installed console script
(whose ``sys.path`` does not hold the current directory: the CLI must add it for the planted kernels),
on a planted kernel that sleeps 0.2 s per call, and signals it while it runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flashcheck import AttentionCase

from ._kernels import CALLS_FILE
from ._run import K

ROOT = Path(__file__).resolve().parents[2]


def _command() -> list:
    script = shutil.which("flashcheck", path=str(Path(sys.executable).parent))
    return [sys.executable, script] if script else [sys.executable, "-m", "flashcheck.cli"]


def _wait_for(predicate, what: str, proc, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the campaign ended before {what}: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.05)


@pytest.mark.parametrize("kernel, signum, extra, code", [
    ("slow_bug", signal.SIGTERM, [], 1),             # a bug found before: exit 1
    ("slow", signal.SIGINT, [], 0),                  # Ctrl-C, nothing found: exit 0
    ("slow", signal.SIGTERM, ["--no-isolation"], 0),  # the same in-process
])
def test_an_interrupted_campaign_writes_its_summary_and_keeps_its_corpus(tmp_path, kernel, signum, extra, code):
    corpus, summary_path, calls = tmp_path / "corpus", tmp_path / "summary.json", tmp_path / "calls"
    proc = subprocess.Popen(
        _command() + ["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", "1",
                      "--max-examples", "1000", "--corpus", str(corpus), "--json", str(summary_path),
                      "--no-progress", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": "", CALLS_FILE: str(calls)})
    if code:  # wait until the bug is on disk, then interrupt (hypothesis is shrinking it by then)
        _wait_for(lambda: any(corpus.glob("*-found-*.json")), "saved finding", proc)
    else:  # a case makes at most 6 kernel calls (5 for its properties): 8 calls, at least one case done
        _wait_for(lambda: calls.is_file() and len(calls.read_text()) >= 16, "8 kernel calls", proc)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, (out, err)
    summary = json.loads(summary_path.read_text())
    assert summary["stopped"] == "interrupted" and summary["cases"] >= 1
    assert "stopped: interrupted" in out and "Traceback" not in err, err
    assert summary["verdict"] == ("BUG" if code else "PASS")
    for finding in summary["findings"]:
        assert AttentionCase.load(finding["path"]).shapes.n_q > 16
    if code:
        assert [f["kinds"] for f in summary["findings"] if not f["shrunk"]] == [["crash"]]


@pytest.mark.parametrize("extra", [[], ["--jobs", "2"]])
@pytest.mark.parametrize("after_s", [0.5, 1.5])  # after Python itself has started
def test_ctrl_c_while_the_command_starts_up_gives_a_summary_not_a_traceback(tmp_path, after_s, extra):
    # Ctrl-C reaches the whole process group: the CLI and the workers it spawns while torch loads.
    summary = tmp_path / "s.json"
    proc = subprocess.Popen(_command() + ["fuzz", "torch:math", "--device", "cpu", "--max-examples", "50",
                                          "--corpus", str(tmp_path / "corpus"), "--json", str(summary), *extra],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    time.sleep(after_s)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert "Traceback" not in err and "Fatal Python error" not in err, err
    result = json.loads(summary.read_text())
    assert result["stopped"] == "interrupted" and result["cases"] < 50, out
    assert proc.returncode == {"NO_CASES": 3, "PASS": 0}[result["verdict"]]
    assert f": {result['verdict']}" in out.splitlines()[0]


@pytest.mark.parametrize("extra", [[], ["--jobs", "2"]])
def test_ctrl_c_does_not_reach_the_compilers_a_kernel_runs(tmp_path, extra):
    # A compiler killed mid-compile (Triton's ptxas) prints its whole input and fails the launch: Ctrl-C at the
    # terminal goes to the campaign, which stops its kernel worker itself.
    calls, summary = tmp_path / "calls", tmp_path / "s.json"
    proc = subprocess.Popen(_command() + ["fuzz", f"{K}:compiles", "--device", "cpu", "--preset", "smoke",
                                          "--max-examples", "1000", "--json", str(summary), "--no-progress",
                                          "--corpus", str(tmp_path / "corpus"), *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONPATH": "", CALLS_FILE: str(calls)})
    def compiling() -> bool:  # two calls done, and a compiler running now
        lines = calls.read_text().split() if calls.is_file() else []
        done = len([x for x in lines if x != "started"])
        return done >= 2 and lines.count("started") > done

    _wait_for(compiling, "a compiler at work", proc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    assert json.loads(summary.read_text())["stopped"] == "interrupted", out
    statuses = calls.read_text().split()
    assert "-2" not in statuses, f"a compiler died of the Ctrl-C: {statuses}"
