"""Which verdicts the defect models describe, and where a distinct bug's explanation goes: on the finding and on its
bug while that finding is the bug's smallest example, through combined summaries (workers, machines) and a worker's
findings re-sent once named."""

from __future__ import annotations

import math

import pytest

from flashcheck.campaign.bugs import BugTally, bugs_with_findings, combine_bugs
from flashcheck.campaign.causes import Cause
from flashcheck.campaign.scheduler.seeds import _keep
from flashcheck.defects.naming import describes
from flashcheck.judge.verdict import BUG, SUSPICIOUS, Finding, Verdict

CAUSE = Cause("numerical:out", "out over the error budget")


def _verdict(*findings) -> Verdict:
    return Verdict.from_findings([Finding(kind, status, "what went wrong", details=details)
                                  for kind, status, details in findings], max_ratio=math.nan)


@pytest.mark.parametrize("findings, described", [
    ([("over_budget", BUG, {})], True),
    ([("nonfinite", BUG, {}), ("lse", BUG, {})], True),
    ([("masked_row_promise", BUG, {}), ("reordering_outlier", SUSPICIOUS, {})], True),
    ([("over_budget", BUG, {"gradient": "dq"})], True),
    ([("crash", BUG, {})], False),
    ([("wrong_output", BUG, {})], False),
    ([("over_budget", BUG, {}), ("nondeterminism", BUG, {})], False),  # a rerun's finding: not the output alone
    ([("over_budget", BUG, {"layout": "transposed"})], False),  # only the layout property's rerun broke
    ([("reordering_outlier", SUSPICIOUS, {})], False),
])
def test_the_models_describe_numerical_bugs_of_the_cases_own_output(findings, described):
    assert describes(_verdict(*findings)) is described


def _entry(path: str, *, shrunk: bool, elements: int, model: dict | None = None) -> dict:
    entry = {"status": BUG, "cause": CAUSE.key, "title": CAUSE.title, "dtype": "fp16", "kinds": ["over_budget"],
             "diagnosis": [f"rows of {path}"], "case": path, "elements": elements, "shrunk": shrunk, "path": path}
    return entry if model is None else {**entry, "model": model, "title": f"{CAUSE.title}; matches {model['named']}"}


def _model(named: str | None) -> dict:
    return {"named": named, "line": f"matches {named}: ..." if named else "defect models: none of 9 matches"}


def test_the_bug_takes_the_model_of_its_smallest_finding_whenever_that_one_is_named():
    tally = BugTally()
    found, shrunk = _entry("found", shrunk=False, elements=900), _entry("shrunk", shrunk=True, elements=90)
    tally.saved(CAUSE, BUG, found)
    tally.name(CAUSE, found, _model("p_rounded(bf16)"))
    [bug] = tally.as_list()
    assert bug["model"]["named"] == "p_rounded(bf16)" and bug["title"] == f"{CAUSE.title}; matches p_rounded(bf16)"
    tally.saved(CAUSE, BUG, shrunk)  # smaller, not named yet: the bug shows what its example shows
    [bug] = tally.as_list()
    assert bug["model"] is None and bug["title"] == CAUSE.title
    tally.name(CAUSE, shrunk, _model(None))
    tally.name(CAUSE, found, _model("sums_in(bf16)"))  # the case as found is no longer the example
    [bug] = tally.as_list()
    assert bug["model"] == _model(None) and bug["title"] == CAUSE.title and bug["smallest"] is shrunk
    assert found["title"] == f"{CAUSE.title}; matches sums_in(bf16)"  # the finding's own title names its model


def _bug(entry: dict) -> dict:
    tally = BugTally()
    tally.saved(CAUSE, BUG, entry)
    return tally.as_list()[0]


def test_combined_bugs_keep_the_model_and_title_of_the_smallest_example():
    larger = _bug(_entry("a/found", shrunk=False, elements=900, model=_model("scale_slip(applied twice)")))
    smaller = _bug(_entry("b/shrunk", shrunk=True, elements=90, model=_model("acc_not_rescaled")))
    for order in ([larger, smaller], [smaller, larger]):
        [bug] = combine_bugs([[b] for b in order], sources=["one", "two"])
        assert bug["model"]["named"] == "acc_not_rescaled" and bug["title"].endswith("; matches acc_not_rescaled")
        assert bug["smallest"]["path"] == "b/shrunk"
    unnamed = _bug(_entry("c/shrunk", shrunk=True, elements=30))
    [bug] = combine_bugs([[smaller], [unnamed]])
    assert bug["model"] is None and bug["title"] == CAUSE.title


def test_a_worker_that_died_keeps_the_model_of_the_findings_it_sent_again_once_named():
    first = _entry("w/shrunk", shrunk=True, elements=90)
    sent: list = []
    _keep(sent, first)
    _keep(sent, _entry("w/found", shrunk=False, elements=900))
    _keep(sent, {**first, "model": _model("acc_not_rescaled"), "title": f"{CAUSE.title}; matches acc_not_rescaled"})
    assert [f["path"] for f in sent] == ["w/shrunk", "w/found"] and sent[0]["model"]["named"] == "acc_not_rescaled"
    snapshot = _bug(_entry("w/found", shrunk=False, elements=900))
    [bug] = bugs_with_findings([snapshot], sent)
    assert bug["model"]["named"] == "acc_not_rescaled" and bug["smallest"]["path"] == "w/shrunk"
