"""``selftest --cases N --bug-cases M``: each option counts its own rows' cases, whichever is larger."""

from __future__ import annotations

import pytest

from flashcheck.kernels.registry import resolve_kernel
from flashcheck.selftest import run as selftest_run
from flashcheck.selftest.config import SelftestConfig
from flashcheck.selftest.rows import row_parts
from flashcheck.selftest.run import RowRunner, run_selftest
from flashcheck.selftest.subjects import Subject


def _math() -> object:
    return resolve_kernel("torch:math", device="cpu")


# torch:math twice: as a correct row, and as a "planted bug" no detector ever catches (so it runs every case)
SUBJECTS = [Subject("math", True, "correct", "torch:math", _math),
            Subject("never_caught", False, "test", "torch:math posing as a planted bug", _math)]


@pytest.fixture
def subjects(monkeypatch):
    monkeypatch.setattr(selftest_run, "subjects", lambda device, names=None, which="all", backward=False: SUBJECTS)


def test_a_planted_bug_runs_its_bug_cases_even_past_cases(subjects):
    rows = {r.variant: r for r in run_selftest(SelftestConfig("cpu", ("fp32",), cases=2, bug_cases=5, max_n=8))}
    assert rows["math"].cases == 2 and rows["never_caught"].cases == 5


def test_fewer_bug_cases_than_cases_keep_the_cases_they_had(subjects):
    """A planted bug's cases are the first --bug-cases of the correct rows' list, as before."""
    runner = RowRunner(SelftestConfig("cpu", cases=6, bug_cases=3, max_n=8))
    kernel = _math()
    correct, bug = (runner.recipes(v, kernel, "fp32") for v in SUBJECTS)
    assert len(correct) == 6 and bug[:3] == correct[:3]
    longer = RowRunner(SelftestConfig("cpu", cases=2, bug_cases=5, max_n=8))
    assert len(longer.recipes(SUBJECTS[0], kernel, "fp32")) == 2
    assert len(longer.recipes(SUBJECTS[1], kernel, "fp32")) == 5


def test_chunks_of_a_planted_bug_cover_its_bug_cases_whatever_cases_is():
    assert row_parts(False, 3, 9, 3) == [(0, 3), (3, 6), (6, 9)]
    assert row_parts(False, 5, 10) == [(0, 10)]
    assert row_parts(True, 3, 9, 3) == [(0, 3)]
