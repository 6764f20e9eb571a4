"""examples/kernel_repo, a kernel repository using the plugin as a user would, passes its own tests on the
CPU: its Triton kernel runs under the Triton interpreter (its pytest sets TRITON_INTERPRET=1 from
--flashcheck-device cpu). The GPU lane is the same command with --flashcheck-require-gpu on a CUDA machine."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from ._repo import run_pytest

pytestmark = [pytest.mark.interpreter,
              pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (its interpreter)")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "kernel_repo"


def test_example_kernel_repo_passes_on_the_cpu(tmp_path):
    repo = tmp_path / "kernel_repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns(".flashcheck", ".hypothesis", "__pycache__"))
    result = run_pytest(repo, "--flashcheck-device", "cpu", "--flashcheck-max-examples", "5",
                        PYTHONPATH=str(repo / "src"))
    assert result.ret == 0, result.stdout.str()
    result.assert_outcomes(passed=3)  # test_attention[fp16], test_attention[fp32], test_attention_adversarial
    result.stdout.fnmatch_lines(["*= flashcheck =*",
                                 "tinyflash.attention:attention fp16: * cases, * PASS, 0 SUSPICIOUS, 0 BUG; *",
                                 "tinyflash.attention:attention fp32: * cases, * PASS, 0 SUSPICIOUS, 0 BUG; *"])
    rows = json.loads((repo / ".flashcheck" / "verdicts.json").read_text())["summary"]  # the ini key's path
    assert {row["dtype"] for row in rows} == {"fp16", "fp32"} and all(row["BUG"] == 0 for row in rows)
