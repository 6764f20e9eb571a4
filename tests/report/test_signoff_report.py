"""flashcheck signoff: report.json against its schema, the verdict per kernel, pass and dtype, and the pages."""

from __future__ import annotations

import copy
import dataclasses
import json
import re

import jsonschema
import pytest

from flashcheck.report import SCHEMA_VERSION, schema


def _errors(report: dict) -> list[str]:
    validator = jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker())
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(report)]


def test_the_schema_is_itself_valid():
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["properties"]["schema_version"]["const"] == SCHEMA_VERSION


def test_report_json_validates_against_its_schema(signoff_report):
    _, _, report = signoff_report
    assert _errors(report) == []


@pytest.mark.parametrize("break_it, where", [
    (lambda r: r.pop("machine"), "machine"),
    (lambda r: r["campaigns"][0]["dtypes"][0].update(status="SIGNED-OFF", reasons=["a bug"]), "reasons"),
    (lambda r: r["campaigns"][0]["dtypes"][0].update(status="BLOCKED", reasons=[]), "reasons"),
    (lambda r: r["bugs"][0].update(status="PASS"), "status"),
    (lambda r: r["cases"]["rows"][0].__setitem__(11, -1.0), "rows"),
    (lambda r: r.update(schema_version=SCHEMA_VERSION + 1), "schema_version"),
])
def test_the_schema_rejects_a_broken_report(signoff_report, break_it, where):
    broken = copy.deepcopy(signoff_report[2])
    break_it(broken)
    errors = _errors(broken)
    assert errors and any(where in e for e in errors), errors


def test_a_bug_blocks_its_kernel_and_a_correct_kernel_is_signed_off(signoff_report):
    _, code, report = signoff_report
    assert code == 1 and report["status"] == "BLOCKED"
    cells = {(c["kernel"], c["pass"], x["dtype"]): x for c in report["campaigns"] for x in c["dtypes"]}
    math_cells = [x for (k, _, _), x in cells.items() if k == "torch:math"]
    assert {p for (k, p, _) in cells if k == "torch:math"} == {"forward", "backward"}
    assert all(x["status"] == "SIGNED-OFF" and x["judged"] >= 5 for x in math_cells), math_cells
    planted = [x for (k, _, _), x in cells.items() if k != "torch:math"]
    assert planted and all(x["status"] == "BLOCKED" and x["bugs"] for x in planted)
    # A suspicious finding may join them: the sign-off's time budget decides how many cases each campaign draws.
    assert {b["cause"] for b in report["bugs"] if b["status"] == "BUG"} == {"layout", "numerical:out"}, "two bugs"
    assert any("declares no backward pass" in x for x in report["not_checked"])
    assert report["totals"]["judged"] == len(report["cases"]["rows"]) == sum(c["judged"] for c in report["campaigns"])


def test_each_bug_keeps_a_replayable_smallest_case(signoff_report, capsys):
    from flashcheck.cli import main

    out, _, report = signoff_report
    for bug in report["bugs"]:
        path = out / bug["smallest"]["path"]  # relative to the report's folder
        assert path.exists() and bug["smallest"]["replay"] == f"flashcheck replay {bug['smallest']['path']} --device cpu"
    assert main(["replay", str(out / report["bugs"][0]["smallest"]["path"]), "--device", "cpu"]) == 1
    assert "BUG" in capsys.readouterr().out


def test_coverage_counts_the_judged_cases(signoff_report):
    _, _, report = signoff_report
    cov = report["coverage"]
    n = len(report["cases"]["rows"])
    assert all(sum(counts.values()) == n for counts in cov["axes"].values())
    assert sum(sum(m.values()) for m in cov["values_by_mask"].values()) == n
    assert 1 < cov["combinations"] <= n


def test_markdown_and_html_say_the_same_and_the_page_is_self_contained(signoff_report):
    out, _, report = signoff_report
    md, page = (out / "report.md").read_text(), (out / "index.html").read_text()
    for text in ("# flashcheck sign-off: BLOCKED", "## Distinct bugs (2)", "## Coverage", "## Machine"):
        assert text in md
    assert "flashcheck sign-off: " in page and "Distinct bugs (2)" in page
    pngs = sorted(p.stem for p in (out / "plots").glob("*.png"))
    assert pngs == sorted(["ratio-forward", "ratio-backward", "worst-heatmap", "ratio-vs-keys"])
    assert len(re.findall(r'<img [^>]*src="data:image/png;base64,', page)) == len(pngs)
    assert not re.search(r'(src|href)="(https?:|//)', page), "nothing may load from elsewhere"
    for name in pngs:
        assert f"](plots/{name}.png)" in md


def test_report_re_renders_the_same_pages(signoff_report, tmp_path, capsys):
    from flashcheck.cli import main

    out, _, _ = signoff_report
    assert main(["report", str(out), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "report.md").read_text() == (out / "report.md").read_text()
    assert (tmp_path / "index.html").read_text() == (out / "index.html").read_text()
    assert "BLOCKED" in capsys.readouterr().out


def test_two_reports_side_by_side(signoff_report, tmp_path):
    from flashcheck.cli import main

    out, _, report = signoff_report
    other = copy.deepcopy(report)
    gone = other["bugs"].pop()
    other["machine"]["torch"] = "9.9.9"
    (tmp_path / "newer").mkdir()
    (tmp_path / "newer" / "report.json").write_text(json.dumps(other))
    assert main(["report", str(out), str(tmp_path / "newer"), "--out", str(tmp_path / "cmp")]) == 0
    md = (tmp_path / "cmp" / "compare.md").read_text()
    assert "9.9.9" in md and report["machine"]["torch"] in md
    row = next(line for line in md.splitlines() if f"| {gone['cause']} |" in line)
    assert row.rstrip(" |").endswith("absent"), row
    assert (tmp_path / "cmp" / "compare.html").exists()


@pytest.mark.parametrize("argv, says", [
    (["report", "/nonexistent/report-dir"], "report='/nonexistent/report-dir'"),
    (["signoff", "torch:nonexistent", "--device", "cpu", "--out", "x"], "torch:nonexistent"),
    (["signoff", "torch:math", "--device", "cpu", "--min-cases", "0", "--out", "x"], "--min-cases"),
    (["signoff", "torch:math", "--device", "cpu", "--time-budget", "-1", "--out", "x"], "--time-budget"),
])
def test_usage_errors_name_the_argument_and_run_nothing(argv, says, tmp_path, monkeypatch, capsys):
    from flashcheck.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_comparing_needs_an_out_folder(signoff_report, capsys):
    from flashcheck.cli import main

    out, _, _ = signoff_report
    assert main(["report", str(out), str(out)]) == 2
    assert "--out" in capsys.readouterr().err


def test_the_report_names_flashcheck_s_commit(monkeypatch):
    from flashcheck.report.machine import SOURCE_COMMIT, flashcheck_version

    monkeypatch.setenv(SOURCE_COMMIT, "0123456789abcdef")
    assert flashcheck_version()["commit"] == "0123456789abcdef"  # what the runner says ran wins over any .git
    monkeypatch.delenv(SOURCE_COMMIT)
    version = flashcheck_version()
    assert version["version"] and (version["commit"] is None or len(version["commit"]) == 40)


def test_report_json_keeps_one_line_per_case_and_reads_back_the_same(signoff_report):
    from flashcheck.report.render import report_json

    out, _, report = signoff_report
    text = (out / "report.json").read_text()
    assert json.loads(text) == report == json.loads(report_json(report))
    rows = report["cases"]["rows"]
    without_rows = report_json({**report, "cases": {**report["cases"], "rows": []}})
    assert rows and text.count("\n") == without_rows.count("\n") + len(rows) + 1  # each case row on one line


def test_without_matplotlib_a_signoff_says_so_before_it_runs(tmp_path, monkeypatch, capsys):
    import sys

    from flashcheck.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    assert main(["signoff", "torch:math", "--device", "cpu", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install 'flashcheck[report]'" in err
    assert not (tmp_path / "x").exists()


def test_an_interrupted_signoff_stops_and_reports_what_ran(tmp_path, monkeypatch, capsys):
    from flashcheck.campaign.parallel import run_campaigns
    from flashcheck.report import signoff

    def interrupted(*args, **kwargs):  # the first campaign is stopped by Ctrl-C
        return dataclasses.replace(run_campaigns(*args, **kwargs), stopped="interrupted")

    monkeypatch.setattr(signoff, "run_campaigns", interrupted)
    from flashcheck.cli import main

    code = main(["signoff", "torch:math", "torch:flash", "--device", "cpu", "--preset", "smoke", "--max-examples",
                 "6", "--seed", "1", "--jobs", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    assert code == 1 and [c["kernel"] for c in report["campaigns"]] == ["torch:math"]
    assert "torch:flash: forward (the sign-off was interrupted before it)" in report["not_checked"]
    assert all("stopped early (interrupted)" in " ".join(x["reasons"]) for x in report["campaigns"][0]["dtypes"])
    out = capsys.readouterr().out  # the console names what never ran, as the report does
    assert "  not checked: torch:flash: forward (the sign-off was interrupted before it)\n" in out


def test_the_bugs_heading_counts_bugs_and_suspicious_findings_apart(signoff_report):
    from flashcheck.report.render import report_blocks

    report = copy.deepcopy(signoff_report[2])
    report["bugs"] = [dict(b, status="BUG") for b in report["bugs"]]
    report["bugs"].append(dict(report["bugs"][0], status="SUSPICIOUS"))
    headings = [text for kind, text, *_ in report_blocks(report, []) if kind == "h2"]
    bugs = len(report["bugs"]) - 1
    assert f"Distinct bugs ({bugs}) and suspicious findings (1)" in headings, headings


def test_each_numerical_bug_shows_the_defect_models_line(signoff_report):
    out, _, report = signoff_report
    numerical = next(b for b in report["bugs"] if b["cause"] == "numerical:out")
    line = numerical["model"]["line"]
    assert line.startswith(("matches ", "defect models: ")), line
    assert f"| defect model | {line} |" in (out / "report.md").read_text()
    assert "<td>defect model</td>" in (out / "index.html").read_text()


def test_a_named_bug_shows_its_model_beside_it(signoff_report):
    from flashcheck.report.render import report_blocks, to_markdown

    report = copy.deepcopy(signoff_report[2])
    bug = report["bugs"][0]
    line = "matches p_rounded(bf16): the kernel rounds P to bf16 before P @ V (bitwise)"
    bug.update(title=bug["title"] + "; matches p_rounded(bf16)", model={"named": "p_rounded(bf16)", "line": line})
    assert _errors(report) == []
    md = to_markdown(report_blocks(report, []))
    assert f"[{bug['cause']}]: {bug['title']}" in md and f"| defect model | {line} |" in md
