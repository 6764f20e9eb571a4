"""The pytest plugin: the fixture fails a test on BUG, the summary counts verdicts, JSON survives xdist."""

from __future__ import annotations

import json

import pytest

pytest_plugins = ["pytester"]

TEST_FILE = """
import flashcheck
from flashcheck.case import AttentionCase
from flashcheck.regimes import make_values
from flashcheck.twin import twin_attention
from flashcheck.validation import Shapes

@flashcheck.kernel(causal=("none",), precision="flash")
def good(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal)

@flashcheck.kernel(causal=("none",), precision="flash")
def bad(q, k, v, *, scale, causal, attn_mask=None):
    out, lse = good(q, k, v, scale=scale, causal=causal)
    return out * 1.01, lse

def case():
    s = Shapes(1, 1, 1, 9, 20, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp16", seed=1)
    return AttentionCase.create(q, k, v, scale=0.25)

def test_good(flashcheck):
    assert flashcheck.check(good, case()).status == "PASS"

def test_bad(flashcheck):
    flashcheck.check(bad, case())
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]])
def test_plugin_fixture_summary_and_json(pytester, workers):
    pytester.makepyfile(test_kernels=TEST_FILE)
    out = pytester.path / "verdicts.json"
    result = pytester.runpytest_subprocess("--flashcheck-device", "cpu",
                                "--flashcheck-json", str(out), *workers)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*BUG over_budget*"])
    result.stdout.fnmatch_lines(["*= flashcheck =*", "*:bad: 0 PASS, 0 SUSPICIOUS, 1 BUG*",
                                 "*:good: 1 PASS, 0 SUSPICIOUS, 0 BUG*"])
    records = json.loads(out.read_text())["verdicts"]
    assert sorted(r["status"] for r in records) == ["BUG", "PASS"]
    assert all(r["test"].startswith("test_kernels.py::") for r in records)
