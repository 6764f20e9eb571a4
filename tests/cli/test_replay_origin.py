"""A saved case replays from the kernel it came from, whatever the kernel's display name, by the printed
command, verbatim, in a fresh process: from a campaign's summary, a sign-off report and old cases."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from flashcheck.inputs.case import AttentionCase

# A user's module whose kernel shows a display name that is no import path ("mylib" does not exist).
MODULE = '''
import flashcheck, torch

@flashcheck.kernel(name="mylib:decode", dtypes=("fp32",))
def decode(q, k, v, *, scale, causal, attn_mask=None):
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    out = torch.softmax(s, -1) @ v.double()
    out[..., 3:, :] *= 1.01  # rows past 3 are 1% off
    return out.to(q.dtype)
'''


FLASHCHECK = str(Path(sys.executable).parent / "flashcheck")  # the console script pip installed


def flashcheck_cli(*args, cwd, timeout=600):
    """``flashcheck ...`` as a user runs it: a fresh process, in ``cwd``, with no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([FLASHCHECK, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def run_verbatim(command: str, *, cwd):
    """A printed command, word for word (``flashcheck`` being this environment's console script)."""
    words = shlex.split(command)
    assert words[:2] == ["flashcheck", "replay"], command
    return flashcheck_cli(*words[1:], cwd=cwd)


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("user_repo")
    (repo / "mylib_kernels.py").write_text(MODULE)
    result = flashcheck_cli("fuzz", "mylib_kernels:decode", "--device", "cpu", "--max-examples", "20", "--seed", "1",
                            "--json", "summary.json", "--no-progress", cwd=repo)
    assert result.returncode == 1, result.stdout + result.stderr
    return repo, json.loads((repo / "summary.json").read_text())


def _a_bug(summary) -> str:
    return next(f["path"] for f in summary["findings"] if f["status"] == "BUG")


def test_a_campaigns_printed_replay_commands_work_verbatim(user_repo):
    repo, summary = user_repo
    verdicts = {f["replay"]: f["status"] for f in summary["findings"]}
    verdicts.update({b["smallest"]["replay"]: b["status"] for b in summary["bugs"]})
    assert "BUG" in verdicts.values()
    printed = flashcheck_cli("merge", "summary.json", cwd=repo).stdout
    assert all(f"replay: {c}" in printed for c in verdicts)
    for command, status in verdicts.items():
        replayed = run_verbatim(command, cwd=repo)
        assert replayed.stdout.startswith(f"{status}: mylib:decode"), replayed.stdout + replayed.stderr
        assert replayed.returncode == (1 if status == "BUG" else 0)


def test_the_case_records_how_its_kernel_was_reached(user_repo):
    repo, summary = user_repo
    provenance = AttentionCase.load(repo / summary["findings"][0]["path"]).provenance
    assert provenance["kernel"] == "mylib:decode"
    assert provenance["kernel_source"] == "mylib_kernels:decode"
    assert Path(provenance["kernel_import_root"]) == repo.resolve()


def test_a_case_replays_from_another_folder(user_repo, tmp_path):
    repo, summary = user_repo
    path = (repo / _a_bug(summary)).resolve()
    replayed = flashcheck_cli("replay", str(path), "--device", "cpu", cwd=tmp_path)
    assert replayed.returncode == 1 and "BUG" in replayed.stdout, replayed.stderr


def _without_origin(repo, path, tmp_path) -> Path:
    """The case as flashcheck saved it before cases recorded their kernel's origin."""
    case = AttentionCase.load(repo / path)
    old = {k: v for k, v in case.provenance.items() if k not in ("kernel_source", "kernel_import_root")}
    _, json_path = dataclasses.replace(case, provenance=old).save(tmp_path / "old-case")
    return json_path


def test_an_old_case_says_what_to_pass_and_replays_with_kernel(user_repo, tmp_path):
    repo, summary = user_repo
    old = _without_origin(repo, _a_bug(summary), tmp_path)
    refused = flashcheck_cli("replay", str(old), "--device", "cpu", cwd=repo)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--kernel='mylib:decode'" in refused.stderr and "Pass --kernel with the kernel's import path" in refused.stderr
    replayed = flashcheck_cli("replay", str(old), "--kernel", "mylib_kernels:decode", "--device", "cpu", cwd=repo)
    assert replayed.returncode == 1 and "BUG" in replayed.stdout, replayed.stderr


def test_a_signoff_reports_replay_command_works_from_the_report_folder(user_repo):
    repo, _ = user_repo
    result = flashcheck_cli("signoff", "mylib_kernels:decode", "--out", "signoff", "--device", "cpu", "--preset",
                            "smoke", "--max-examples", "15", "--seed", "2", "--min-cases", "1", cwd=repo)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((repo / "signoff" / "report.json").read_text())
    verdicts = {b["smallest"]["replay"]: b["status"] for b in report["bugs"] if b.get("smallest")}
    assert "BUG" in verdicts.values()
    for command, status in verdicts.items():
        replayed = run_verbatim(command, cwd=repo / "signoff")
        assert replayed.stdout.startswith(f"{status}: mylib:decode"), replayed.stdout + replayed.stderr
        assert replayed.returncode == (1 if status == "BUG" else 0)
