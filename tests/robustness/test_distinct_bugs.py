"""Distinct bugs: a campaign groups its failing cases by root cause and leads with the groups."""

from __future__ import annotations

from flashcheck import AttentionCase

from ._run import fuzz


def test_a_numerical_bug_and_a_layout_assumption_are_two_distinct_bugs(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "assumes_contiguous", "--keep-going", "--max-examples", "60")
    assert code == 1 and summary["verdict"] == "BUG"
    assert list(summary)[:2] == ["verdict", "bugs"], "the JSON leads with the distinct bugs"
    bugs = {b["cause"]: b for b in summary["bugs"]}
    assert set(bugs) == {"layout", "numerical:out"}, summary["bugs"]
    layout, numerical = bugs["layout"], bugs["numerical:out"]
    # contiguous cases count where the layout property's rerun in the strided layout failed
    seen = layout["cases"] + layout["shrink_cases"]  # drawn, and met while shrinking the other bug
    assert set(layout["layouts"]) - {"contiguous"} and sum(layout["layouts"].values()) == seen
    assert set(numerical["layouts"]) >= {"contiguous"}, "the numerical defect shows in every layout"
    assert sum(b["cases"] for b in bugs.values()) == sum(summary["bug_signatures"].values())
    assert len(summary["findings"]) >= 2 and {f["cause"] for f in summary["findings"]} == set(bugs)
    for bug in bugs.values():  # each keeps its smallest case, shrunk, with its replay command
        assert bug["smallest"]["shrunk"] and bug["smallest"]["replay"].startswith("flashcheck replay ")
        assert bug["saved"] == 2 and sum(bug["dtypes"].values()) == bug["cases"] + bug["shrink_cases"]
        assert bug["cases"] > 0
    # shrunk toward the contiguous layout, the case still shows the defect in the layout property's rerun
    shrunk = AttentionCase.load(layout["smallest"]["path"])
    assert shrunk.layout.name != "contiguous" or "layout_dependence" in layout["smallest"]["kinds"]
    assert 8 < AttentionCase.load(numerical["smallest"]["path"]).shapes.n_q
    out = capsys.readouterr().out
    assert "distinct bugs: 2" in out and out.index("distinct bugs: 2") < out.index("raw findings (")


def test_a_layout_failure_is_named_by_rerunning_the_case_contiguous(tmp_path):
    # the rerun is timed apart: the summary's time split has a triage part
    code, summary = fuzz(tmp_path, "assumes_contiguous", "--keep-going", "--max-examples", "30", seed=3)
    assert code == 1 and summary["time_split_s"]["triage"] > 0


def test_merged_jobs_merge_bugs_by_cause(tmp_path):
    code, summary = fuzz(tmp_path, "assumes_contiguous", "--keep-going", "--max-examples", "40", "--jobs", "2")
    assert code == 1 and summary["jobs"] == 2
    causes = [b["cause"] for b in summary["bugs"]]
    assert len(causes) == len(set(causes)) and "layout" in causes, summary["bugs"]
    assert [b["id"] for b in summary["bugs"]] == list(range(1, len(causes) + 1))
    assert sum(b["cases"] for b in summary["bugs"]) == sum(summary["bug_signatures"].values())
    assert all(b["smallest"]["source"].startswith("worker") for b in summary["bugs"])
