"""What a sign-off's cases rule out (the 95% bound per cell and value regime), what they drew, the field's
rules on the same outputs, and --min-regime-cases."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from flashcheck.report import build_report, schema
from flashcheck.report.confidence import anchor_table, rate_bound, thin_regimes
from flashcheck.report.render import confidence_text

from ._committed import unpacked

COMMITTED = "signoff-h200-2026-12-01"


# 1 - 0.05^(1/n) to 15 digits (mpmath, 30 digits)
@pytest.mark.parametrize("n, bound", [(1, 0.95), (3, 0.631596850135961), (100, 0.0295130496070399),
                                      (2730, 0.00109673597415124)])
def test_the_bound_is_the_exact_one_sided_95_percent_bound(n, bound):
    assert rate_bound(n) == pytest.approx(bound, rel=1e-6)
    assert (1 - rate_bound(n)) ** n == pytest.approx(0.05)  # n clean cases at that rate: 5% likely


def test_the_bound_is_the_rule_of_three_for_many_cases_and_none_for_no_case():
    assert 1_000_000 * rate_bound(1_000_000) == pytest.approx(-math.log(0.05), rel=1e-5)  # 2.996: "3/n"
    assert rate_bound(0) is None


def test_the_bound_in_words():
    text = confidence_text({"judged": 2730, "failed": 0, "upper_95": rate_bound(2730), "observed": 0.0})
    assert text.startswith("n = 2,730 judged cases, none failed: on the cases this preset draws, a defect that "
                           "hits more than 1 in 911 cases") and text.endswith("with 95% probability")
    assert "failure rate of 4% on" in confidence_text({"judged": 300, "failed": 12, "upper_95": None, "observed": 0.04})
    assert "nothing is ruled out" in confidence_text({"judged": 0, "failed": 0, "upper_95": None, "observed": None})


def _row(status, ratio, anchors, values="random"):
    return ["fp16", values, "none", "none", "contiguous", 8, 8, 16, status, ratio, None, anchors]


def test_the_anchor_table_sorts_each_case_into_its_quadrant():
    rows = [_row("PASS", 0.5, {"r": "pass"}), _row("BUG", 7.0, {"r": "pass"}), _row("BUG", "nan", {"r": "pass"}),
            _row("PASS", 0.9, {"r": "fail"}), _row("SUSPICIOUS", 0.8, {"r": "fail"}), _row("PASS", 0.1, {"r": "n/a"}),
            _row("PASS", 0.1, None)]
    t = anchor_table(rows)["r"]
    assert (t["both_pass"], t["flashcheck_only"], t["anchor_only"], t["both"], t["not_applicable"]) == (1, 2, 1, 1, 1)
    assert t["max_ratio"] == {"flashcheck_only": "nan", "anchor_only": 0.9}


def test_thin_regimes_counts_the_regimes_asked_about():
    rows = [_row("PASS", 0.1, None, "flat")] * 3 + [_row("PASS", 0.1, None, "ties")]
    assert thin_regimes(rows, {"flat", "ties", "peaked"}, 3) == [("peaked", 0), ("ties", 1)]


def _cells(report):
    return [(c, cell) for c in report["campaigns"] for cell in c["dtypes"]]


def test_a_correct_kernel_s_bound_is_the_formula_for_its_n(signoff_report):
    out, _, report = signoff_report
    md = (out / "report.md").read_text()
    math_cells = [cell for c, cell in _cells(report) if c["kernel"] == "torch:math"]
    for cell in math_cells:
        conf = cell["confidence"]
        assert conf["failed"] == 0 and conf["judged"] == cell["judged"]
        assert conf["upper_95"] == pytest.approx(1 - 0.05 ** (1 / cell["judged"]))
        assert sum(r["judged"] for r in conf["by_values"].values()) == cell["judged"]
        assert all(r["upper_95"] == rate_bound(r["judged"]) for r in conf["by_values"].values())
        assert confidence_text(conf) in md
    blocked = [cell for c, cell in _cells(report) if c["kernel"] != "torch:math"]
    assert all(x["confidence"]["failed"] and x["confidence"]["upper_95"] is None for x in blocked)


def test_each_cell_says_what_it_drew(signoff_report):
    _, _, report = signoff_report
    for c, cell in _cells(report):
        for field in ("values", "mask", "causal", "layout"):
            assert sum(cell["drew"][field].values()) == cell["judged"], (c["kernel"], cell["dtype"], field)
        assert set(cell["drew"]["values"]) == set(cell["confidence"]["by_values"])


def test_every_judged_case_is_judged_by_each_rule(signoff_report):
    _, _, report = signoff_report
    forward, backward = {"flash-attention", "triton-tutorial"}, {"flash-attention", "pytorch-sdpa", "triton-tutorial"}
    for c, cell in _cells(report):
        assert set(cell["anchors"]) == (backward if c["pass"] == "backward" else forward)
        for rule, t in cell["anchors"].items():
            counted = t["both_pass"] + t["flashcheck_only"] + t["anchor_only"] + t["both"] + t["not_applicable"]
            assert counted == cell["judged"], (c["kernel"], c["pass"], cell["dtype"], rule)
            if rule == "flash-attention" and cell["dtype"] == "fp32":
                assert t["not_applicable"] == cell["judged"]  # the 2x rule is undefined on fp32
    anchors_time = [c["time_split_s"]["anchors"] for c in report["campaigns"]]
    assert all(t > 0 for t in anchors_time), anchors_time


@pytest.fixture(scope="module")
def bf16_rounding(tmp_path_factory):
    """A sign-off of an fp32 kernel that rounds its inputs to bf16."""
    from flashcheck.cli import main

    out = tmp_path_factory.mktemp("bf16-rounding")
    code = main(["signoff", "tests.report._kernels:fp32_through_bf16", "--dtype", "fp32", "--device", "cpu",
                 "--preset", "smoke", "--max-examples", "12", "--min-cases", "1", "--seed", "1", "--jobs", "1",
                 "--out", str(out)])
    return out, code, json.loads((out / "report.json").read_text())


def test_flashcheck_catches_what_the_tutorial_s_rule_lets_through(bf16_rounding):
    out, code, report = bf16_rounding
    cell = report["campaigns"][0]["dtypes"][0]
    tutorial = cell["anchors"]["triton-tutorial"]
    assert code == 1 and cell["status"] == "BLOCKED"
    assert tutorial["flashcheck_only"] > 0 and tutorial["max_ratio"]["flashcheck_only"] > 1
    assert cell["confidence"]["observed"] == cell["confidence"]["failed"] / cell["judged"] > 0
    assert "| triton-tutorial |" in (out / "report.md").read_text()


def test_a_regime_with_too_few_cases_blocks_its_cell(signoff_report):
    out, _, report = signoff_report
    runs = []
    for c in report["campaigns"]:
        summary = json.loads((out / c["summary"]).read_text())
        runs.append({"pass": c["pass"], "dtypes": [x["dtype"] for x in c["dtypes"]], "summary": summary,
                     "summary_path": str(out / c["summary"]), "corpus": str(out / c["corpus"])})
    meta = {k: report[k] for k in ("command", "preset", "seed", "device", "machine", "flashcheck", "not_checked")}
    rebuilt = build_report(runs, out=out, meta=meta, min_cases=1, min_regime_cases=1000)
    for c, cell in _cells(rebuilt):
        assert cell["status"] == "BLOCKED"
        thin = [r for r in cell["reasons"] if "--min-regime-cases asks" in r]
        assert len(thin) == 1, cell["reasons"]  # one reason names every thin regime
        for regime, rates in cell["confidence"]["by_values"].items():
            assert f"{regime} {rates['judged']}" in thin[0], thin[0]
    assert rebuilt["min_regime_cases"] == 1000 and _valid(rebuilt)
    unasked = build_report(runs, out=out, meta=meta, min_cases=report["min_cases"])  # the option is off by default
    assert [x["reasons"] for _, x in _cells(unasked)] == [x["reasons"] for _, x in _cells(report)]


def _valid(report) -> bool:
    validator = jsonschema.Draft202012Validator(schema(), format_checker=jsonschema.FormatChecker())
    return not [e.message for e in validator.iter_errors(report)]


def test_a_report_from_before_these_fields_still_validates_and_renders(tmp_path, capsys):
    from flashcheck.cli import main

    unpacked(COMMITTED, tmp_path)
    old = json.loads((tmp_path / "report.json").read_text())
    assert "anchors" not in old["cases"]["columns"] and _valid(old)
    assert main(["report", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    assert "## Verdict per kernel" in md and "What the cases rule out" not in md


def test_a_fuzz_campaign_pays_nothing_for_the_anchors(tmp_path):
    from flashcheck.cli import main

    main(["fuzz", "torch:math", "--device", "cpu", "--preset", "smoke", "--max-examples", "4", "--seed", "1",
          "--corpus", str(tmp_path / "c"), "--json", str(tmp_path / "s.json")])
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["counts"]["by_status"] and summary["time_split_s"]["anchors"] == 0


def test_a_quantized_cell_states_its_quantization_error_apart_from_its_verdict(tmp_path):
    from flashcheck.cli import main

    code = main(["signoff", "torch:fp8-kv-token", "--device", "cpu", "--preset", "smoke", "--max-examples", "16",
                 "--min-cases", "5", "--seed", "1", "--jobs", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    cells = _cells(report)
    stated = [cell for _, cell in cells if "quantization_error" in cell]
    assert code == 0 and stated and _valid(report), [cell["dtype"] for _, cell in cells]
    for cell in stated:
        error = cell["quantization_error"]
        assert cell["status"] == "SIGNED-OFF" and not any("quantization" in r for r in cell["reasons"])
        assert error["cases"] >= 1 and 0.9 < error["min_cosine"] <= 1 and error["max_rel"] >= 0
    md = (tmp_path / "report.md").read_text()
    assert "## The quantization error, apart from the verdicts" in md
    from flashcheck.contract.formats import ALL_DTYPES

    assert schema()["$defs"]["dtype"]["enum"] == list(ALL_DTYPES)  # an fp8 cell's dtype is a report's dtype too
    assert f"{stated[0]['quantization_error']['min_cosine']:.6f}" in md
