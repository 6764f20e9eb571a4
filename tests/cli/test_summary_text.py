"""What ``fuzz`` and ``merge`` print at their end, for people: long lists cut to their most frequent items and
wrapped at the terminal's width, split counts that agree on one line, a capped list of raw findings, and the
backward pass said and measured per gradient. The JSON keeps everything."""

from __future__ import annotations

import copy

from flashcheck.cli.summary import print_summary

WIDTH = 100


def _bug(**over) -> dict:
    bug = {"id": 1, "cause": "numerical:out", "title": "over the error budget", "status": "BUG", "cases": 3,
           "shrink_cases": 0, "regimes": {"random/none": 3}, "dtypes": {"fp16": 3}, "layouts": {"contiguous": 3},
           "causal": {"none": 3}, "parts": {"out": 3}, "kinds": ["over_budget"], "max_ratio": 4.0,
           "diagnosis": ["rows 0..2 of 3"], "smallest": {"case": "fp16 B=1", "shrunk": True, "replay": "replay it"}}
    return {**bug, **over}


def _finding(i: int = 0, diagnosis=("rows 0..2 of 3",)) -> dict:
    return {"status": "BUG", "cause": "numerical:out", "kinds": ["over_budget"], "shrunk": False,
            "case": f"fp16 B=1 case{i}", "diagnosis": list(diagnosis), "replay": f"replay case{i}"}


def _summary(**over) -> dict:
    summary = {"verdict": "BUG", "kernel": "k", "device": "cpu", "preset": "smoke", "first_case_s": 1.0, "cases": 3,
               "examples": 3, "elapsed_s": 2.0, "cases_per_s": 1.5, "stopped": "bug_found",
               "time_split_s": {"kernel": 1.0}, "compilations": 0, "isolation": "worker", "case_timeout_s": 600,
               "worker_restarts": 0, "timeouts": 0, "info": {}, "skipped": {"oom": 0}, "skipped_reasons": {},
               "max_ratio_by_dtype": {"fp16": 4.0}, "counts": {"by_dtype": {"fp16": 3}}, "coverage": {},
               "properties": {}, "bugs": [], "notes": [], "findings": [], "backward": False}
    return {**summary, **over}


def _printed(summary: dict, capsys, monkeypatch, **kw) -> str:
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    kept = copy.deepcopy(summary)
    print_summary(summary, **kw)
    assert summary == kept  # the JSON's data stays whole: only the text is cut
    return capsys.readouterr().out


def test_a_bugs_long_lists_show_the_five_most_frequent_and_fit_the_terminal(capsys, monkeypatch):
    regimes = {f"values{i}/mask{i % 7}/paged=full,pages=16": 200 - i for i in range(150)}
    layouts = {f"layout{i}": 10 + i for i in range(8)}
    out = _printed(_summary(bugs=[_bug(regimes=regimes, layouts=layouts)]), capsys, monkeypatch)
    assert max(map(len, out.splitlines())) <= WIDTH, out
    flat = " ".join(out.split())
    assert "regimes: values0/mask0/paged=full,pages=16 200, " in flat and "values4/mask4/paged=full,pages=16 196 " \
        "and 145 more" in flat and "values5/" not in flat
    assert "layouts: layout7 17, layout6 16, layout5 15, layout4 14, layout3 13 and 3 more;" in flat


def test_coverage_and_never_judged_lines_are_cut_and_wrapped(capsys, monkeypatch):
    values = {"random": 3, **{f"regime{i}": 0 for i in range(40)}}
    coverage = {dtype: {"dtype": {dtype: 3}, "values": values, "mask": {"none": 3, "causal_like": 0}}
                for dtype in ("fp16", "bf16")}
    out = _printed(_summary(coverage=coverage), capsys, monkeypatch)
    assert max(map(len, out.splitlines())) <= WIDTH, out
    flat = " ".join(out.split())
    assert "coverage (judged cases): values 1/41, mask 1/2; never judged: values=regime0, values=regime1, " \
           "values=regime2, values=regime3, values=regime4 and 36 more" in flat
    assert "never judged in bf16: values=regime0, values=regime1, values=regime2, values=regime3, " \
           "values=regime4 and 36 more" in flat


def _split_lines(rest: str, counts=(1, 2, 3, 8), sequences: int = 4) -> list:
    return [f"num_splits={n}: sequence {b} of {sequences} (3 queries, 17 keys): {rest}" for n in counts
            for b in range(sequences)]


def test_lines_that_agree_across_split_counts_print_once(capsys, monkeypatch):
    nan = "nan where the oracle is finite: 16 of 16 elements; rows 0 of 1"
    lines = _split_lines(nan) + ["num_splits=8: sequence 0 of 4 (3 queries, 17 keys): lse off on 12 of 12 rows",
                                 "grows with the number of keys"]
    out = _printed(_summary(bugs=[_bug(diagnosis=lines)], findings=[_finding(diagnosis=lines)]), capsys, monkeypatch)
    for b in range(4):  # once under the distinct bug, once under its raw finding
        assert out.count(f"num_splits 1, 2, 3, 8: sequence {b} of 4 (3 queries, 17 keys): {nan}\n") == 2, out
    assert out.count("num_splits=8: sequence 0 of 4 (3 queries, 17 keys): lse off") == 2  # alone: as it was
    assert out.count("grows with the number of keys") == 2 and "num_splits=1:" not in out
    lines = _split_lines("16 of 16 elements", counts=(2,)) + _split_lines("15 of 16 elements", counts=(3,))
    out = _printed(_summary(findings=[_finding(diagnosis=lines)]), capsys, monkeypatch)
    assert out.count("num_splits=2: ") == out.count("num_splits=3: ") == 4  # counts that differ stay apart


def test_the_raw_findings_printed_are_capped_and_the_rest_pointed_to(capsys, monkeypatch):
    findings = [_finding(i) for i in range(12)]
    out = _printed(_summary(findings=findings), capsys, monkeypatch, json_path="out/summary.json")
    assert "raw findings (12, each saved case):" in out
    assert "replay case4" in out and "replay case5" not in out
    assert "and 7 more findings: see out/summary.json" in out
    out = _printed(_summary(findings=findings), capsys, monkeypatch)  # no --json: the corpus holds them
    assert "and 7 more findings" in out and "--json" in out
    out = _printed(_summary(findings=findings[:5]), capsys, monkeypatch)
    assert "replay case4" in out and "more findings" not in out


def test_a_backward_summary_says_so_and_gives_each_gradients_largest_err_budget(capsys, monkeypatch):
    by_gradient = {"fp16": {"dq": 0.5, "dk": 0.25, "dv": 0.75, "dsinks": 0.125}, "bf16": {"dq": "nan"}}
    summary = _summary(backward=True, max_ratio_by_dtype={"fp16": 0.75, "bf16": "nan"},
                       max_ratio_by_gradient=by_gradient, counts={"by_dtype": {"fp16": 3, "bf16": 1}})
    out = _printed(summary, capsys, monkeypatch)
    assert out.splitlines()[0] == "flashcheck fuzz k on cpu (preset smoke), backward pass: BUG"
    assert "  fp16: 3 cases, max error/budget 0.75 (dq 0.5, dk 0.25, dv 0.75, dsinks 0.125)" in out
    assert "  bf16: 1 cases, max error/budget nan (dq nan)" in out
    forward = _printed(_summary(), capsys, monkeypatch)
    assert "backward" not in forward and "  fp16: 3 cases, max error/budget 4\n" in forward


def test_a_bug_named_by_a_defect_model_prints_its_line_under_the_smallest_case(capsys, monkeypatch):
    line = ("matches p_rounded(bf16): the kernel rounds P to bf16 before P @ V, narrower than its contract allows "
            "(err/budget 0.3 against the model on 90% of the broken elements, 95% within one budget)")
    named = _bug(title="over the error budget; matches p_rounded(bf16)", model={"named": "p_rounded(bf16)",
                                                                                "line": line})
    out = _printed(_summary(bugs=[named, _bug(id=2, cause="crash:ValueError", model=None)]), capsys, monkeypatch)
    assert max(map(len, out.splitlines())) <= WIDTH, out
    flat = " ".join(out.split())
    assert "#1 BUG [numerical:out] over the error budget; matches p_rounded(bf16)" in flat
    assert f"smallest case (shrunk): fp16 B=1 rows 0..2 of 3 {line} replay: replay it" in flat
    assert flat.count("matches p_rounded(bf16):") == 1  # the unnamed bug prints none
