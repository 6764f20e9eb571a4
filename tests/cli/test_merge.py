"""flashcheck merge: one summary from the --json summaries of campaigns run side by side."""

from __future__ import annotations

import json

import pytest

from flashcheck import InvalidArgument
from flashcheck.campaign.combine import combine_summaries
from flashcheck.campaign.result import CampaignResult
from flashcheck.campaign.summary import CampaignSummary
from flashcheck.cli import main
from flashcheck.judge.verdict import NO_CASES

K = "tests.cli._planted"


def combined(summaries: list[dict], sources: list[str] | None = None) -> dict:
    """What ``flashcheck merge`` writes for summaries as their JSON has them."""
    names = sources or [f"summary[{i}]" for i in range(len(summaries))]
    return combine_summaries([CampaignSummary.from_dict(s, name) for s, name in zip(summaries, names)],
                             sources=sources).as_dict()


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    """Two real campaigns: a correct kernel (PASS) and a planted tail-tile bug (BUG, shrunk)."""
    root = tmp_path_factory.mktemp("merge")
    paths = {}
    for name, kernel, seed, examples in (("pass", "correct", "2", "8"), ("bug", "tail_bug", "1", "200")):
        paths[name] = root / f"{name}.json"
        main(["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", seed, "--max-examples",
              examples, "--corpus", str(root / name), "--json", str(paths[name]), "--no-progress", "--no-isolation"])
    return paths


def load(path):
    return json.loads(path.read_text())


def test_bug_and_pass_merge_to_bug_with_the_finding_and_its_replay(summaries, tmp_path, capsys):
    out = tmp_path / "merged.json"
    assert main(["merge", str(summaries["pass"]), str(summaries["bug"]), "--json", str(out)]) == 1
    printed = capsys.readouterr().out
    merged, ok, bug = load(out), load(summaries["pass"]), load(summaries["bug"])
    assert ok["verdict"] == "PASS" and bug["verdict"] == "BUG" and merged["verdict"] == "BUG"
    assert set(merged) == set(bug) | {"sources"}, "a consumer of one summary reads a merged one the same way"
    assert merged["findings"] == [{**f, "source": str(summaries["bug"])} for f in bug["findings"]]
    assert all(f["replay"] in printed for f in bug["findings"])
    assert merged["cases"] == ok["cases"] + bug["cases"] and merged["examples"] == ok["examples"] + bug["examples"]
    for key in ("by_status", "by_dtype", "by_regime"):
        for value in set(ok["counts"][key]) | set(bug["counts"][key]):
            total = ok["counts"][key].get(value, 0) + bug["counts"][key].get(value, 0)
            assert merged["counts"][key][value] == total, (key, value)
    assert merged["max_ratio_by_dtype"]["fp16"] == max(ok["max_ratio_by_dtype"]["fp16"],
                                                       bug["max_ratio_by_dtype"]["fp16"]) > 1
    assert merged["elapsed_s"] == max(ok["elapsed_s"], bug["elapsed_s"])
    assert merged["cases_per_s"] == pytest.approx(merged["cases"] / merged["elapsed_s"], abs=1e-3)
    assert merged["time_split_s"]["kernel"] == pytest.approx(ok["time_split_s"]["kernel"] +
                                                             bug["time_split_s"]["kernel"], abs=2e-3)
    assert merged["bug_signatures"] == bug["bug_signatures"] and merged["case_log"] is None
    assert [(s["source"], s["verdict"], s["cases"], s["case_log_sha256"]) for s in merged["sources"]] == [
        (str(summaries[n]), load(summaries[n])["verdict"], load(summaries[n])["cases"],
         load(summaries[n])["case_log_sha256"]) for n in ("pass", "bug")]
    assert merged["kernel"] == [f"{K}:correct", f"{K}:tail_bug"]
    assert any("different kernels" in n for n in merged["notes"])


def test_passes_merge_to_pass_and_a_merge_merges_again(summaries, tmp_path):
    once = tmp_path / "once.json"
    assert main(["merge", str(summaries["pass"]), str(summaries["pass"]), "--json", str(once)]) == 0
    merged = load(once)
    assert merged["verdict"] == "PASS" and merged["kernel"] == f"{K}:correct" and not merged["notes"]
    twice = combined([merged, load(summaries["bug"])], sources=["once", "bug"])
    assert twice["verdict"] == "BUG" and twice["cases"] == merged["cases"] + load(summaries["bug"])["cases"]
    assert [s["source"] for s in twice["sources"]] == [f"once/{summaries['pass']}"] * 2 + ["bug"]


def test_a_merge_that_judged_no_case_never_says_pass():
    empty = CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=0).as_dict()
    skipped = CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=1, cases=3,
                             examples=3, elapsed=1.0)
    skipped.skipped["oom"] = 3
    merged = combined([empty, skipped.as_dict()])
    assert merged["verdict"] == NO_CASES and merged["skipped"] == {"oom": 3} and merged["cases"] == 3
    assert combined([])["verdict"] == NO_CASES


def test_keys_the_merge_has_no_rule_for_merge_by_their_type():
    a = {**CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=1).as_dict(),
         "later_count": 2, "later_reasons": {"oom: 1 GiB": 1}, "later_list": ["x"], "later_name": "n"}
    b = {**a, "seed": 2, "later_count": 3, "later_reasons": {"oom: 1 GiB": 2, "unsupported: D=24": 1},
         "later_list": ["y"], "later_name": "m"}
    merged = combined([a, b])
    assert merged["later_count"] == 5 and merged["later_reasons"] == {"oom: 1 GiB": 3, "unsupported: D=24": 1}
    assert merged["later_list"] == ["x", "y"] and merged["later_name"] == ["n", "m"] and merged["seed"] == [1, 2]
    assert merged["case_timeout_s"] is None and merged["preset"] == "smoke", "kept, not summed"


@pytest.mark.parametrize("content, words", [
    (None, "cannot be read"),
    ("{not json", "not JSON"),
    ("[1, 2]", "a JSON list"),
    ('{"verdict": "PASS", "cases": 3}', "not a flashcheck summary (no bug_signatures, counts, device"),
    ("cases as text", "not a flashcheck summary (wrong type of cases)"),
])
def test_bad_files_exit_2_naming_the_file_and_the_problem(summaries, tmp_path, capsys, content, words):
    bad = tmp_path / "bad.json"
    if content == "cases as text":
        content = json.dumps({**load(summaries["pass"]), "cases": "3"})
    if content is not None:
        bad.write_text(content)
    assert main(["merge", str(summaries["pass"]), str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and words in err and "flashcheck fuzz --json" in err, err


def test_records_keep_one_header_and_sources_with_other_columns_do_not_merge():
    def summary(seed, columns, records):
        return {**CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=seed).as_dict(),
                "record_columns": columns, "records": records}

    merged = combined([summary(1, ["dtype", "status"], [["fp16", "PASS"]]),
                              summary(2, ["dtype", "status"], [["bf16", "PASS"]])])
    assert merged["record_columns"] == ["dtype", "status"]
    assert merged["records"] == [["fp16", "PASS"], ["bf16", "PASS"]]
    with pytest.raises(InvalidArgument, match=r"summary\[1\].*records have the columns \['status'\]"):
        combined([summary(1, ["dtype", "status"], []), summary(2, ["status"], [])])


def test_the_largest_err_budget_of_each_gradient_is_kept_not_summed():
    def summary(seed, by_gradient):
        return {**CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=seed,
                                 backward=True).as_dict(), "max_ratio_by_gradient": by_gradient}

    merged = combined([summary(1, {"fp16": {"dq": 0.5, "dk": 0.25, "dv": 0.5}}),
                              summary(2, {"fp16": {"dq": 0.75, "dk": "nan", "dv": 0.5}, "bf16": {"dq": 0.125}})])
    assert merged["max_ratio_by_gradient"] == {"fp16": {"dq": 0.75, "dk": "nan", "dv": 0.5}, "bf16": {"dq": 0.125}}
