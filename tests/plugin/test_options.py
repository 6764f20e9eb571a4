"""Options, ini keys, markers and profiles: each refused value names the option, echoes the value and
says how to fix it; --flashcheck-require-gpu fails on a machine with no CUDA GPU."""

from __future__ import annotations

import pytest

from ._repo import run_pytest

pytest_plugins = ["pytester"]

TRIVIAL = "def test_nothing():\n    pass\n"


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.skipif("has_cuda()", reason="checks the refusal on a machine with no CUDA GPU")
@pytest.mark.parametrize("how", ["option", "ini"])
def test_require_gpu_fails_without_a_gpu(pytester, how):
    pytester.makepyfile(test_trivial=TRIVIAL)
    if how == "ini":
        pytester.makeini("[pytest]\nflashcheck_require_gpu = true\n")
    result = run_pytest(pytester.path, *(["--flashcheck-require-gpu"] if how == "option" else []))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: flashcheck: --flashcheck-require-gpu: no CUDA GPU is visible *"
                                 "this GPU lane would pass by skipping*"])
    assert "passed" not in result.stdout.str()


def test_require_gpu_refuses_device_cpu(pytester):
    pytester.makepyfile(test_trivial=TRIVIAL)
    result = pytester.runpytest("--flashcheck-require-gpu", "--flashcheck-device", "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--flashcheck-require-gpu with device cpu*Drop --flashcheck-require-gpu*"])


@pytest.mark.parametrize("args, ini, expected", [
    (["--flashcheck-max-examples", "0"], "", "*--flashcheck-max-examples='0': expected an integer >= 1. Pass e.g.*"),
    (["--flashcheck-seed", "x"], "", "*--flashcheck-seed='x': expected an integer >= 0. Pass e.g.*"),
    (["--flashcheck-preset", "nosuch"], "", "*--flashcheck-preset='nosuch': neither a built-in preset nor a TOML "
                                            "file. Use one of *"),
    (["--flashcheck-device", "gpu"], "", "*--flashcheck-device: invalid choice: 'gpu'*"),
    ([], "flashcheck_max_examples = many", "*ini key flashcheck_max_examples='many': expected an integer >= 1*"),
    ([], "flashcheck_device = tpu", "*ini key flashcheck_device='tpu': unknown device. Use one of [[]'cuda', 'cpu'[]]*"),
    ([], "flashcheck_preset = missing.toml", "*ini key flashcheck_preset='missing.toml': neither a built-in*"),
])
def test_refused_values_name_the_option_and_the_fix(pytester, args, ini, expected):
    pytester.makepyfile(test_trivial=TRIVIAL)
    if ini:
        pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


MARKED = """
import flashcheck
from flashcheck.numerics.twin import twin_attention

@flashcheck.kernel(causal=("none",), dtypes=("fp16", "bf16"))
def good(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal)

test_good = flashcheck.property_test(good)

def test_with_fixture(flashcheck):
    pass

def test_plain():
    pass
"""


def test_marker_registered_and_given_to_flashcheck_tests(pytester):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest("--strict-markers", "-m", "flashcheck", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["test_marked.py::test_good[[]fp16[]]", "test_marked.py::test_good[[]bf16[]]",
                                 "test_marked.py::test_with_fixture", "*3/4 tests collected (1 deselected)*"])
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.flashcheck: *"])


UNSUPPORTED = """
import flashcheck

@flashcheck.kernel(causal=("none",), dtypes=("fp32",))
def picky(q, k, v, *, scale, causal, attn_mask=None):
    raise flashcheck.Unsupported("nothing today")

test_picky = flashcheck.property_test(picky, max_examples=3, device="cpu")
"""


def test_a_property_test_that_judged_nothing_fails(pytester):
    pytester.makepyfile(test_picky=UNSUPPORTED)
    pytester.makefile(".toml", tiny="max_n = 8\nhead_dims = [8]\n")
    result = pytester.runpytest("--flashcheck-preset", "tiny.toml", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*flashcheck judged no case of test_picky:picky (fp32): 3 unsupported. "
                                 "A test that judged nothing is not a pass*"])


SLOW_SHRINK = """
import flashcheck, flashcheck.testing.property_test
from flashcheck.numerics.twin import twin_attention

flashcheck.testing.property_test.SHRINK_SECONDS = 0  # no time to shrink: the first failing case is the one reported

@flashcheck.kernel(causal=("none",), dtypes=("fp32",))
def bad(q, k, v, *, scale, causal, attn_mask=None):
    out, lse = twin_attention(q, k, v, scale=scale, causal=causal)
    return (out * 1.01 if k.shape[2] >= 3 else out), lse

test_bad = flashcheck.property_test(bad, max_examples=10, device="cpu", seed=2)
"""


def test_shrinking_stops_at_its_time_limit(pytester):
    pytester.makepyfile(test_slow_shrink=SLOW_SHRINK)
    pytester.makefile(".toml", tiny="max_n = 16\nhead_dims = [8]\nmax_batch = 1\nmax_heads = 1\n")
    result = pytester.runpytest("--flashcheck-preset", "tiny.toml", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*failed on case * drawn, * (shrinking stopped after 0 s):",
                                 "replay: *flashcheck replay *--device cpu"])
