"""``--jobs`` on the command line (fuzz, presets, selftest), and NO_CASES: a campaign that judged no case."""

from __future__ import annotations

import json

import pytest

from flashcheck.cli import main
from flashcheck.cli.options import EXIT_NO_CASES

from .test_cli import K, fuzz


def test_a_campaign_that_judged_no_case_says_no_cases_and_exits_3(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "always_out_of_memory", "--max-examples", "6")
    assert code == EXIT_NO_CASES == 3 and summary["verdict"] == "NO_CASES" and summary["findings"] == []
    assert summary["cases"] == 6 and summary["skipped"]["oom"] == 6 and not summary["counts"]["by_status"]
    reasons = summary["skipped_reasons"]
    assert sum(reasons.values()) == 6 and all(r.startswith("oom: ") and "Tried to allocate" in r for r in reasons)
    out = capsys.readouterr().out
    assert ": NO_CASES" in out and "skipped (not judged): 6 cases (6 out of memory)" in out
    assert all(f"{n} x {reason}" in out for reason, n in reasons.items())


def test_jobs_from_a_preset_and_a_merged_no_cases(tmp_path, capsys):
    preset = tmp_path / "two.toml"
    preset.write_text('max_examples = 6\ndtypes = ["fp16"]\nmax_n = 24\njobs = 2\n')
    code, summary = fuzz(tmp_path, "always_out_of_memory", "--preset", str(preset))
    assert code == 3 and summary["verdict"] == "NO_CASES" and summary["jobs"] == 2
    assert [w["cases"] for w in summary["sources"]] == [3, 3] and summary["skipped"]["oom"] == 6
    assert sum(summary["skipped_reasons"].values()) == 6
    # --no-isolation runs the kernel here, so one process, whatever the preset says
    code, summary = fuzz(tmp_path, "always_out_of_memory", "--preset", str(preset), "--no-isolation")
    assert code == 3 and "jobs" not in summary and summary["isolation"] == "in-process"


@pytest.mark.parametrize("extra, words", [
    (["--jobs", "0"], "--jobs=0: expected a number of worker processes, at least 1"),
    (["--jobs", "2", "--no-isolation"], "--jobs=2: worker processes run the kernel by name"),
])
def test_bad_jobs_are_usage_errors_naming_jobs(tmp_path, extra, words, capsys):
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--corpus", str(tmp_path), *extra]) == 2
    assert words in capsys.readouterr().err
    assert main(["selftest", "--device", "cpu", "--jobs", "-1"]) == 2
    assert "--jobs=-1" in capsys.readouterr().err


def test_fuzz_help_lists_the_exit_statuses(capsys):
    with pytest.raises(SystemExit):
        main(["fuzz", "--help"])
    assert "3 no case was judged (NO_CASES" in capsys.readouterr().out


def test_selftest_rows_in_two_processes_are_the_rows_of_one(tmp_path, capsys):
    args = ["selftest", "--device", "cpu", "--dtype", "fp16", "--dtype", "fp32", "--cases", "4", "--bug-cases", "4",
            "--max-n", "32", "--variant", "torch:math", "--variant", "scale_ignored"]
    tables, rows = [], []
    for jobs in ("1", "2"):
        path = tmp_path / f"jobs{jobs}.json"
        assert main(args + ["--jobs", jobs, "--json", str(path)]) == 0
        tables.append(capsys.readouterr().out)
        rows.append([{**r, "seconds": None} for r in json.loads(path.read_text())])
    assert len(rows[0]) == 4 and rows[0] == rows[1]
    assert tables[0] == tables[1] and "caught 2/2 planted bugs" in tables[0]
