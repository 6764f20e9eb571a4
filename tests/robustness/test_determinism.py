"""The same seed gives the same cases (with an empty hypothesis database), bugs and restarts included."""

from __future__ import annotations

from ._run import fuzz


def _findings(summary) -> list:
    return [(f["kinds"], f["case"], f["shrunk"]) for f in summary["findings"]]


def test_the_same_seed_gives_the_same_cases(tmp_path):
    a, b = (fuzz(tmp_path, "correct", "--max-examples", "8", seed=7, name=name)[1] for name in ("a", "b"))
    assert len(a["case_log"]) == 8 and a["case_log"] == b["case_log"]
    assert a["case_log_sha256"] == b["case_log_sha256"]
    # the worker changes where the kernel runs, not which cases it gets; another seed, other cases
    here = fuzz(tmp_path, "correct", "--max-examples", "8", "--no-isolation", seed=7, name="here")[1]
    other = fuzz(tmp_path, "correct", "--max-examples", "8", "--no-isolation", seed=8, name="other")[1]
    assert here["isolation"] == "in-process" and here["case_log"] == a["case_log"]
    assert other["case_log"] != a["case_log"] and other["case_log_sha256"] != a["case_log_sha256"]


def test_the_same_seed_gives_the_same_cases_past_several_bugs(tmp_path):
    # keep-going runs hypothesis once per bug, each round with a seed derived from the campaign's
    a, b = (fuzz(tmp_path, "two_bugs", "--keep-going", "--max-examples", "16", seed=3, name=name)[1]
            for name in ("a", "b"))
    assert a["findings"] and _findings(a) == _findings(b)
    assert a["case_log"] == b["case_log"] and a["bug_signatures"] == b["bug_signatures"]
