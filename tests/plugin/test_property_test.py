"""The plugin as a kernel repository meets it: property_test, assert_passes and the fixture in one test
module, run once serially and once under pytest-xdist, with options from the command line and from ini keys."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

import pytest

from ._repo import FAILED, PASSED, clean_env, failure_section, make_repo, run_pytest

# Serial run: options from ini keys (paths relative to the ini file), the command line overriding one of them.
SERIAL_INI = """\
flashcheck_preset = tiny.toml
flashcheck_max_examples = 1000
flashcheck_device = cpu
flashcheck_corpus = saved
flashcheck_json = out/verdicts.json
"""
# Under xdist: the seed and the example count from ini keys, the rest on the command line.
PARALLEL_INI = """\
flashcheck_seed = 3
flashcheck_max_examples = 4
"""


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("serial"), ini=SERIAL_INI)
    result = run_pytest(repo, "--flashcheck-max-examples", "4", "--flashcheck-seed", "3",
                        "--hypothesis-profile", "flashcheck-ci", EXPECT_PROFILE="flashcheck-ci")
    return repo, result, json.loads((repo / "out" / "verdicts.json").read_text())


@pytest.fixture(scope="module")
def parallel(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("parallel"), ini=PARALLEL_INI)
    result = run_pytest(repo, "-n", "2", "--flashcheck-preset", "tiny.toml", "--flashcheck-device", "cpu",
                        "--flashcheck-json", "verdicts.json")
    return repo, result, json.loads((repo / "verdicts.json").read_text())


def generated(data: dict, test: str) -> list[str]:
    """The cases a test drew before any failure, in order."""
    return [r["case"] for r in data["verdicts"] if r["test"] == test and r.get("phase") == "generate"]


def test_outcomes_one_test_per_dtype(serial, parallel):
    for _, result, _ in (serial, parallel):
        outcomes = result.parseoutcomes()
        # On a mismatch, say which inner tests failed and why (the inner run's output is not shown otherwise).
        assert (outcomes.get("passed"), outcomes.get("failed")) == (PASSED, FAILED), "\n".join(
            line for line in result.outlines if line.startswith(("FAILED", "E ")))
    serial[1].stdout.fnmatch_lines(["FAILED test_kernels.py::test_bad[[]fp16[]] - Failed: flashcheck: *"])
    assert not any("test_good[" in line and "FAILED" in line for line in serial[1].outlines)


def test_failing_property_test_shows_verdict_and_a_replay_command_that_works(serial):
    repo, result, _ = serial
    section = failure_section(result, "test_bad[fp16]")
    text = "\n".join(section)
    for expected in ("flashcheck: test_kernels:bad (fp16, cpu) failed on case", "BUG: test_kernels:bad on fp16",
                     "BUG over_budget:", "worst element", "budget ", "output_rounding", "drawn from: Recipe("):
        assert expected in text, expected
    assert "Traceback" not in text and "def test_property" not in text  # the verdict, not flashcheck's source
    saved = next(line.split(": ", 1)[1] for line in section if line.startswith("saved: "))
    assert saved.startswith("saved/test_kernels-bad-over_budget-")  # the ini key's folder, next to the ini file
    assert (repo / saved).is_file() and (repo / saved).with_suffix(".npz").is_file()
    replay = next(line.split(": ", 1)[1] for line in section if line.startswith("replay: "))
    assert replay == f"PYTHONPATH=. flashcheck replay {saved} --device cpu"
    done = subprocess.run(replay, shell=True, cwd=repo, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("BUG: test_kernels:bad on fp16")


def test_given_tests_fail_with_the_shrunk_case_saved_once(serial):
    repo, result, data = serial
    text = "\n".join(failure_section(result, "test_given_bad"))
    assert "KernelCheckFailed: BUG: test_kernels:bad" in text and "replay: PYTHONPATH=. flashcheck replay saved/" in text
    assert "FailedHealthCheck" not in result.stdout.str()
    given_saves = [r for r in data["verdicts"] if r["test"] == "test_kernels.py::test_given_bad" and r.get("saved")]
    assert len(given_saves) == 1 and "-shrunk-" in given_saves[0]["saved"]  # the case hypothesis reported
    assert f"KernelCheckFailed: BUG: test_kernels:bad on {given_saves[0]['case']}" in text
    saved = json.loads((repo / given_saves[0]["saved"]).read_text())
    assert saved["provenance"]["kernel"] == "test_kernels:bad"  # cases() drew it for no kernel: replay needs one
    fixture_text = "\n".join(failure_section(result, "test_fixture_bad"))
    assert "BUG over_budget" in fixture_text and "flashcheck replay saved/" in fixture_text


def test_command_line_wins_over_the_test_which_wins_over_ini(serial, parallel):
    _, _, data = serial
    assert len(generated(data, "test_kernels.py::test_good[fp16]")) == 4         # --flashcheck-max-examples, not ini 1000
    assert len(generated(data, "test_kernels.py::test_good_fp32[fp32]")) == 4    # the command line over max_examples=2
    _, _, data = parallel
    assert len(generated(data, "test_kernels.py::test_good[fp16]")) == 4         # ini key over the preset's 5
    assert len(generated(data, "test_kernels.py::test_good_fp32[fp32]")) == 2    # max_examples=2 over the ini key


def test_seed_fixes_the_cases_serially_and_under_xdist(serial, parallel):
    """--flashcheck-seed 3 (serial, derandomized profile) and flashcheck_seed = 3 (xdist, default profile)."""
    test = "test_kernels.py::test_good[fp16]"
    assert generated(serial[2], test) == generated(parallel[2], test) != []


def test_terminal_summary_per_kernel_and_dtype(serial, parallel):
    for _, result, _ in (serial, parallel):
        result.stdout.fnmatch_lines([
            "*= flashcheck =*",
            "test_kernels:bad fp16: * cases (* while shrinking), * PASS, * SUSPICIOUS, * BUG; max error/budget *",
            "    replay: PYTHONPATH=. flashcheck replay *--device cpu",
        ])
        result.stdout.fnmatch_lines(["test_kernels:good fp16: * cases, * PASS, 0 SUSPICIOUS, 0 BUG; max error/budget 0.*"])
        result.stdout.fnmatch_lines(["test_kernels:good fp32: * cases, * PASS, 0 SUSPICIOUS, 0 BUG; max error/budget 0.*"])


def test_json_holds_every_check_also_under_xdist(serial, parallel):
    for repo, _, data in (serial, parallel):
        sources = Counter((r["test"].split("[")[0], r["source"]) for r in data["verdicts"])
        for test, source in [("test_kernels.py::test_good", "property_test"),
                             ("test_kernels.py::test_bad", "property_test"),
                             ("test_kernels.py::test_given_good", "assert_passes"),
                             ("test_kernels.py::test_given_fixture", "assert_passes"),
                             ("test_kernels.py::test_fixture_bad", "assert_passes")]:
            assert sources[test, source] >= 1, (test, source)
        rows = {(row["kernel"], row["dtype"]): row for row in data["summary"]}
        assert set(rows) == {("test_kernels:good", "fp16"), ("test_kernels:good", "fp32"), ("test_kernels:bad", "fp16")}
        bad = rows["test_kernels:bad", "fp16"]
        assert bad["BUG"] >= 3 and bad["max_ratio"] > 1 and len(bad["replay"]) >= 3
        assert rows["test_kernels:good", "fp16"]["BUG"] == 0 and rows["test_kernels:good", "fp16"]["max_ratio"] <= 1
        assert data["replay"] == [cmd for row in data["summary"] for cmd in row["replay"]]
    corpus = parallel[0] / ".flashcheck" / "corpus"  # the default corpus: under the rootdir
    assert len(list(corpus.glob("test_kernels-bad-over_budget-*.json"))) >= 3
