"""property_test(kernel, backward=True) in a kernel repository: a test per dtype and pass, a failing
backward shows which gradient and a replay command that re-runs the backward pass."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from ._repo import clean_env, run_pytest

ROOT = Path(__file__).resolve().parents[2]

KERNELS = '''
import flashcheck
from tests.robustness._kernels import BACKWARD_SPEC, autograd_attention

SPEC = dict(BACKWARD_SPEC, dtypes=("fp16",), head_dims=(16,))


@flashcheck.kernel(**SPEC)
def good(q, k, v, *, scale, causal, attn_mask=None):
    return autograd_attention(q, k, v, scale)


@flashcheck.kernel(**SPEC)
def bad_backward(q, k, v, *, scale, causal, attn_mask=None):
    """The forward is right; dQ misses the softmax scale."""
    return autograd_attention(q, k, v, scale, on_dq=lambda g: g / scale)


test_good = flashcheck.property_test(good, backward=True, max_examples=6)
test_bad = flashcheck.property_test(bad_backward, backward=True, max_examples=12)
'''

TINY = """
description = "tiny"
max_examples = 6
max_n = 24
max_batch = 1
max_heads = 2
head_dims = [16]
"""


def test_backward_property_tests_pass_and_fail_by_pass_with_a_replay_that_reruns_the_backward(tmp_path):
    (tmp_path / "test_kernels.py").write_text(KERNELS)
    (tmp_path / "tiny.toml").write_text(TINY)
    (tmp_path / "pytest.ini").write_text("[pytest]\nflashcheck_preset = tiny.toml\nflashcheck_device = cpu\n")
    result = run_pytest(tmp_path, "-rf", PYTHONPATH=str(ROOT))  # the kernels come from tests.robustness
    outcomes = result.parseoutcomes()
    assert (outcomes.get("passed"), outcomes.get("failed")) == (3, 1), "\n".join(result.outlines[-30:])
    for line in ("FAILED test_kernels.py::test_bad[[]fp16-backward[]] - Failed: flashcheck: *",
                 "test_kernels:good fp16: * cases, * PASS, 0 SUSPICIOUS, 0 BUG*",
                 "test_kernels:good fp16 backward: * cases, * PASS, 0 SUSPICIOUS, 0 BUG*",
                 "test_kernels:bad_backward fp16: * cases, * PASS, 0 SUSPICIOUS, 0 BUG*",  # its forward is right
                 "test_kernels:bad_backward fp16 backward: * cases (* while shrinking), * BUG*",
                 "flashcheck: test_kernels:bad_backward (fp16, backward, cpu) failed on *"):
        result.stdout.fnmatch_lines([line])
    text = "\n".join(result.outlines)
    assert "dq over its budget" in text
    replay = re.search(r"replay: (.*flashcheck replay .*)", text).group(1)
    words = shlex.split(replay)
    env = clean_env(PYTHONPATH=str(ROOT))
    while "=" in words[0]:  # PYTHONPATH=... prefix
        name, value = words.pop(0).split("=", 1)
        env[name] = value + os.pathsep + env.get(name, "")
    done = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "dq over its budget" in done.stdout and "dO" in done.stdout
