"""The campaign summary is one typed record, ``CampaignSummary``: its JSON keeps its keys and their order, reads
back as it was written, and summaries from older or newer versions still combine (``flashcheck merge``)."""

from __future__ import annotations

import json

import pytest

from flashcheck import InvalidArgument
from flashcheck.campaign.combine import combine_summaries
from flashcheck.campaign.result import CampaignResult
from flashcheck.campaign.summary import CampaignSummary, load_summary

# The JSON summary's keys, in order (docs/cli.md describes them); records only when the campaign kept them.
KEYS = ["verdict", "bugs", "kernel", "device", "preset", "seed", "cases", "examples", "elapsed_s", "cases_per_s",
        "first_case_s", "steady_cases_per_s", "time_split_s", "counts", "max_ratio_by_dtype",
        "max_ratio_by_gradient", "stopped", "properties", "isolation", "case_timeout_s", "keep_going", "backward",
        "skipped", "skipped_reasons", "compilations", "timeouts", "worker_restarts", "bug_signatures", "notes",
        "info", "coverage", "findings", "case_log_sha256", "case_log"]


def _result(**fields) -> CampaignResult:
    return CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=1, **fields)


def test_the_json_keeps_its_keys_in_order():
    assert list(_result().as_dict()) == KEYS
    kept = _result()
    kept.records = [["fp16"]]
    assert list(kept.as_dict()) == KEYS + ["record_columns", "records"]


def test_a_summary_reads_back_as_it_was_written():
    result = _result(cases=3, examples=3, elapsed=1.5)
    result.findings.append({"status": "BUG", "cause": "numerical", "case": "c"})
    written = json.loads(json.dumps(result.as_dict()))
    read = CampaignSummary.from_dict(written, "s.json")
    assert read == result.summary() and read.as_dict() == written and list(read.as_dict()) == list(written)
    combined = combine_summaries([read, read]).as_dict()
    again = CampaignSummary.from_dict(json.loads(json.dumps(combined)), "merged.json").as_dict()
    assert again == combined and list(again) == list(combined) and list(combined)[-1] == "sources"


def test_an_older_summary_combines_without_the_keys_it_lacks_and_a_newer_keeps_its_own():
    old = {k: v for k, v in _result().as_dict().items() if k not in ("coverage", "first_case_s", "compilations")}
    read = CampaignSummary.from_dict(old, "old.json")
    assert read.as_dict() == old and read.coverage is None
    assert set(combine_summaries([read, read]).as_dict()) == set(old) | {"sources"}
    both = combine_summaries([read, CampaignSummary.from_dict(_result().as_dict(), "new.json")]).as_dict()
    assert both["compilations"] == 0 and "coverage" in both
    newer = CampaignSummary.from_dict({**_result().as_dict(), "later": {"x": 1}}, "newer.json")
    assert newer.extra == {"later": {"x": 1}} and newer.as_dict()["later"] == {"x": 1}
    assert combine_summaries([newer, newer]).as_dict()["later"] == {"x": 2}


def test_reading_checks_the_summary_and_names_its_file(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"verdict": "PASS"}))
    with pytest.raises(InvalidArgument, match="s.json.*not a flashcheck summary"):
        load_summary(path)
    path.write_text(json.dumps(_result().as_dict()))
    assert load_summary(path) == _result().summary()


def test_a_worker_that_checked_no_property_adds_nothing_to_the_properties(capsys):
    from flashcheck.campaign.result import properties_summary
    from flashcheck.cli.summary import print_summary

    ran = _result(cases=4, elapsed=2.0)
    ran.properties = properties_summary(["determinism"], 0.25, {"determinism": 4}, 0.5, 2.0)
    early = _result()  # a worker that ended before its first case: the default, nothing checked
    assert early.properties == {"checked": []}
    combined = combine_summaries([CampaignSummary.from_dict(r.as_dict(), f"{i}.json")
                                  for i, r in enumerate((ran, early))]).as_dict()
    assert combined["properties"]["cases"] == {"determinism": 4}, combined["properties"]
    print_summary(combined, None)
    assert "determinism 4" in capsys.readouterr().out
    nothing = combine_summaries([CampaignSummary.from_dict(early.as_dict(), f"{i}.json") for i in range(2)])
    assert nothing.as_dict()["properties"] == {"checked": []}
