"""Cheap to load: with the plugin installed, `pytest --help` and a run of unrelated tests import neither
torch nor triton (a fresh interpreter, since this one has imported both)."""

from __future__ import annotations

import json
import subprocess
import sys

from ._repo import clean_env

SCRIPT = """
import json, sys
import pytest

HEAVY = ("torch", "triton")
seen = {}
pytest.main(["--help"])
seen["help"] = [m for m in HEAVY if m in sys.modules]
assert "flashcheck.plugin" in sys.modules  # loaded through the pytest11 entry point
pytest.main(["-q", "-p", "no:cacheprovider", "--flashcheck-device", "cpu", "--flashcheck-preset", "smoke",
             "--flashcheck-json", "verdicts.json", "test_unrelated.py"])
seen["run"] = [m for m in HEAVY if m in sys.modules]
print("SEEN " + json.dumps(seen))
"""


def test_help_and_unrelated_runs_import_neither_torch_nor_triton(tmp_path):
    (tmp_path / "test_unrelated.py").write_text("def test_unrelated():\n    assert 1 + 1 == 2\n")
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "--flashcheck-require-gpu" in done.stdout and "1 passed" in done.stdout
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SEEN "))[5:])
    assert seen == {"help": [], "run": []}
    assert json.loads((tmp_path / "verdicts.json").read_text())["verdicts"] == []
