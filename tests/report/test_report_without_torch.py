"""``flashcheck report`` re-renders and compares report.json where only the JSON (and matplotlib) is: torch,
triton and hypothesis cannot even be imported, as on a release manager's laptop."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ._committed import committed_report, unpacked

pytest.importorskip("matplotlib")

COMMITTED = "signoff-h200-2026-12-01"
BLOCKED = ("torch", "triton", "hypothesis")

_RUN = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed here")

sys.meta_path.insert(0, Refuse())
from flashcheck.cli import main
code = main({argv!r})
print("loaded:", sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r}))
sys.exit(code)
"""


def _report(*argv: str) -> subprocess.CompletedProcess:
    code = _RUN.format(blocked=BLOCKED, argv=["report", *argv])
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


def test_a_report_re_renders_with_torch_triton_and_hypothesis_unimportable(tmp_path):
    committed = unpacked(COMMITTED, tmp_path / "committed")
    run = _report(str(committed), "--out", str(tmp_path / "again"))
    assert "loaded: []" in run.stdout, run.stdout + run.stderr
    assert run.returncode in (0, 1), run.stderr  # the committed report is BLOCKED: exit 1, with its pages written
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["status"] == committed_report(COMMITTED)["status"]
    assert (tmp_path / "again" / "index.html").stat().st_size > 10_000
    assert (tmp_path / "again" / "report.md").read_text().startswith("#")


def test_two_reports_compare_with_torch_unimportable(tmp_path):
    committed = unpacked(COMMITTED, tmp_path / "committed")
    run = _report(str(committed), str(committed), "--out", str(tmp_path / "side-by-side"))
    assert "loaded: []" in run.stdout, run.stdout + run.stderr
    assert list((tmp_path / "side-by-side").glob("*.html")), run.stdout + run.stderr


def test_the_blocker_really_blocks():
    code = _RUN.format(blocked=BLOCKED, argv=["kernels"]).replace("from flashcheck.cli import main", "import torch")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0 and "torch is not installed here" in run.stderr
