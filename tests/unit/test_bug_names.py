"""Which verdicts the defect models describe, and where a distinct bug's explanation goes: on the finding and on its
bug while that finding is the bug's smallest example, through combined summaries (workers, machines) and a worker's
findings re-sent once named."""

from __future__ import annotations

import math

import pytest

from flashcheck.campaign.bugs import BugTally, bugs_with_findings, combine_bugs
from flashcheck.campaign.causes import Cause
from flashcheck.campaign.result import CampaignResult, keep_finding
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
    keep_finding(sent, first)
    keep_finding(sent, _entry("w/found", shrunk=False, elements=900))
    keep_finding(sent, {**first, "model": _model("acc_not_rescaled"),
                        "title": f"{CAUSE.title}; matches acc_not_rescaled"})
    assert [f["path"] for f in sent] == ["w/shrunk", "w/found"] and sent[0]["model"]["named"] == "acc_not_rescaled"
    snapshot = _bug(_entry("w/found", shrunk=False, elements=900))
    [bug] = bugs_with_findings([snapshot], sent)
    assert bug["model"]["named"] == "acc_not_rescaled" and bug["smallest"]["path"] == "w/shrunk"


class _Campaign:
    """What :class:`BugNames` asks of a campaign: its result, its stop, and its kernel's worker, which runs the
    models (recorded here)."""

    def __init__(self, stop_reason: str | None = None):
        self.result = CampaignResult(verdict=BUG, kernel="k", device="cpu", preset="smoke", seed=0)
        self.stop_reason, self.sent, self.explained = stop_reason, [], []
        self.on_finding = self.sent.append
        self.worker, self.in_kernel, self.explaining, self.last_end = self, False, False, 0.0

    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def explain(self, case) -> dict:
        self.explained.append(case.describe())
        return _model("acc_not_rescaled")


def _saved(folder, cause: Cause, *, n: int, label: str):
    """``(verdict, case, entry)`` of a numerical BUG on an ``n`` by ``n`` case, saved as a campaign saves it."""
    import torch

    from flashcheck.campaign.corpus import save_finding
    from flashcheck.campaign.result import finding_entry
    from flashcheck.inputs.case import AttentionCase

    q = torch.zeros(1, 1, n, 8, dtype=torch.float16)
    case = AttentionCase.create(q, q, q, scale=0.5, provenance={"strategy": "random", "seed": n})
    verdict = _verdict(("over_budget", BUG, {}))
    verdict.kernel, verdict.case = "k", case.describe()
    path = save_finding(folder, verdict, case, label=label)
    return verdict, case, finding_entry(verdict, case, path, cause, shrunk=label == "shrunk", device="cpu")


def test_a_bug_is_named_on_its_shrunk_case_and_one_never_shrunk_on_its_case_as_found_at_the_end(tmp_path):
    from flashcheck.campaign.naming import BugNames

    campaign, other = _Campaign(), Cause("nonfinite:out", "non-finite out")
    names = BugNames(campaign)
    for cause, n, label in ((CAUSE, 40, "found"), (other, 24, "found"), (CAUSE, 3, "shrunk")):
        verdict, case, entry = _saved(tmp_path, cause, n=n, label=label)
        campaign.result.bugs.saved(cause, BUG, entry)
        if label == "found":
            names.found(verdict, case, cause, entry)
        else:
            names.final(verdict, case, cause, entry)
    assert [d.split(" Nk=")[0] for d in campaign.explained] == ["fp16 B=1 Hq=1 Hkv=1 Nq=3"]  # the shrunk one
    names.finish()  # the other bug, never shrunk: its case as found, read back from the corpus
    assert len(campaign.explained) == 2 and "Nq=24" in campaign.explained[1]
    bugs = {b["cause"]: b for b in campaign.result.bugs.as_list()}
    assert {b["model"]["named"] for b in bugs.values()} == {"acc_not_rescaled"}
    assert bugs[other.key]["title"] == "non-finite out; matches acc_not_rescaled"
    assert [e["path"] for e in campaign.sent] == [bugs[CAUSE.key]["smallest"]["path"],
                                                  bugs[other.key]["smallest"]["path"]]  # each sent again, named
    assert campaign.result.notes == []


def test_a_case_too_large_is_not_run_and_a_stopped_campaign_names_none_left(tmp_path):
    from flashcheck.campaign.naming import BugNames

    campaign = _Campaign()
    names = BugNames(campaign)
    verdict, case, entry = _saved(tmp_path, CAUSE, n=2100, label="found")  # 4.4 million scores
    campaign.result.bugs.saved(CAUSE, BUG, entry)
    names.found(verdict, case, CAUSE, entry)
    names.finish()
    assert campaign.explained == [] and entry["model"]["note"].startswith("not run: the case has 4,410,000 scores")
    stopped = _Campaign(stop_reason="interrupted")
    names = BugNames(stopped)
    verdict, case, entry = _saved(tmp_path, CAUSE, n=4, label="found")
    names.found(verdict, case, CAUSE, entry)
    names.finish()
    assert stopped.explained == [] and "model" not in entry
    assert stopped.result.notes == ["the defect models named no bug left unshrunk: the campaign stopped (interrupted)"]
