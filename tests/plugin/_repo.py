"""A small kernel repository for the plugin's tests, run by a fresh pytest process as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Small cases only: each of these runs in seconds on a CPU.
TINY_PRESET = """
description = "tiny: the plugin's tests"
max_examples = 5
min_n = 1
max_n = 32
max_batch = 1
max_heads = 2
head_dims = [16]
"""

KERNELS = '''
import os

import pytest
from hypothesis import given, seed, settings

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_values
from flashcheck.strategies import cases
from flashcheck.numerics.twin import twin_attention
from flashcheck.contract.validation import Shapes


@flashcheck.kernel(causal=("none",), dtypes=("fp16", "fp32"), head_dims=(16, 32), precision="flash")
def good(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal)


@flashcheck.kernel(causal=("none",), dtypes=("fp16",), head_dims=(16, 32), precision="flash")
def bad(q, k, v, *, scale, causal, attn_mask=None):
    """1% off once there are 5 keys or more."""
    out, lse = good(q, k, v, scale=scale, causal=causal)
    return (out * 1.01 if k.shape[2] >= 5 else out), lse


# The one-liners.
test_good = flashcheck.property_test(good)
test_good_fp32 = flashcheck.property_test(good, dtypes="fp32", max_examples=2, preset="tiny.toml")
test_bad = flashcheck.property_test(bad)

# A user's own hypothesis tests.
SMALL = dict(max_n=32, head_dims=[16], max_batch=1, max_heads=2)


@pytest.mark.flashcheck  # no deadline
@settings(max_examples=4)
@given(cases(spec=good.spec, **SMALL))
def test_given_good(case):
    flashcheck.assert_passes(good, case)


@seed(1)
@settings(max_examples=20, deadline=None)
@given(cases(spec=bad.spec, **SMALL))
def test_given_bad(case):
    flashcheck.assert_passes(bad, case)


@settings(max_examples=3)
@given(case=cases(spec=good.spec, **SMALL))
def test_given_fixture(flashcheck, case):
    flashcheck.check(good, case)


# The fixture in plain tests.
def one_case():
    s = Shapes(1, 1, 1, 9, 20, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp16", seed=1)
    return AttentionCase.create(q, k, v, scale=0.25)


def test_fixture_good(flashcheck):
    assert flashcheck.check(good, one_case()).status == "PASS"


def test_fixture_bad(flashcheck):
    flashcheck.check(bad, one_case())


def test_environment():
    from hypothesis import settings

    assert os.environ.get("TRITON_INTERPRET") == "1"  # device cpu: Triton kernels would run interpreted
    profile = settings.get_current_profile_name()
    if "EXPECT_PROFILE" in os.environ:
        assert profile == os.environ["EXPECT_PROFILE"]
    else:  # hypothesis's own choice ("default", or "ci" where CI is set): flashcheck forces none of its own
        assert not profile.startswith("flashcheck"), profile
'''

# The outcomes of KERNELS' tests.
PASSED = 7   # test_good[fp16], test_good[fp32], test_good_fp32[fp32], test_given_good, test_given_fixture,
             # test_fixture_good, test_environment
FAILED = 3   # test_bad[fp16], test_given_bad, test_fixture_bad


def clean_env(**extra) -> dict:
    """The environment of a user's shell: nothing this test session set (the root conftest sets
    TRITON_INTERPRET), the virtualenv's scripts on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER",
                        "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID")}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def make_repo(path: Path, *, ini: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "tiny.toml").write_text(TINY_PRESET)
    (path / "test_kernels.py").write_text(KERNELS)
    (path / "pytest.ini").write_text("[pytest]\n" + ini)
    return path


def run_pytest(path: Path, *args: str, timeout: float = 240, **env) -> pytest.RunResult:
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=path,
                          env=clean_env(**env), capture_output=True, text=True, timeout=timeout)
    return pytest.RunResult(done.returncode, done.stdout.splitlines(), done.stderr.splitlines(),
                            time.monotonic() - start)


def failure_section(result: pytest.RunResult, test_id: str) -> list[str]:
    """The lines of one test's entry under FAILURES."""
    lines = result.outlines
    start = next(i for i, line in enumerate(lines) if line.strip("_ ") == test_id)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(("___", "===="))), len(lines))
    return lines[start:end]
