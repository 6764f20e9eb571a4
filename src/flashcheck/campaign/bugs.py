"""Distinct bugs: a campaign's failing cases grouped by root cause (:mod:`flashcheck.campaign.causes`).

Each distinct bug keeps how many drawn cases hit it and under which regimes, dtypes, layouts and causal
alignments, the largest error/budget seen, its saved cases, and the smallest of them with its replay
command (a shrunk case before one as found), with the defect models' explanation of that case (``"model"``,
:mod:`flashcheck.campaign.naming`; the title names the model that explains it). A campaign's summary and JSON
lead with these; the raw findings follow. Summaries combined from several workers or machines combine their bugs
by cause, each keeping the model of its smallest example.
"""

from __future__ import annotations

import math
from collections import Counter

from ..judge.verdict import BUG, from_json_number, json_number
from .causes import Cause

__all__ = ["BugTally", "bugs_with_findings", "combine_bugs", "titled"]

_COUNTED = ("regimes", "dtypes", "layouts", "causal", "parts")  # counted per case that hits a bug


def _new_bug(cause: Cause, status: str) -> dict:
    return {"cause": cause.key, "title": cause.title, "status": status, "cases": 0, "shrink_cases": 0,
            **{key: {} for key in _COUNTED}, "kinds": [], "max_ratio": None, "diagnosis": [],
            "smallest": None, "saved": 0, "model": None}


def titled(title: str, model: dict | None) -> str:
    """A bug's ``title`` naming the defect model that explains it (``model``: ``Explanation.as_dict()``)."""
    named = (model or {}).get("named")
    return f"{title}; matches {named}" if named else title


def _take_example(bug: dict, entry: dict) -> None:
    """``entry`` (a saved finding) as ``bug``'s smallest example, with its diagnosis, model and title."""
    bug["smallest"], bug["diagnosis"] = entry, list(entry["diagnosis"])
    bug["model"] = entry.get("model")
    bug["title"] = entry.get("title") or bug["title"]


class BugTally:
    """The distinct bugs of one campaign, keyed by cause."""

    def __init__(self):
        self.bugs: dict[str, dict] = {}
        self.lengths: dict[str, list] = {}  # cause -> [(Nk, err/budget)] of drawn cases, for growth with N

    def bug(self, cause: Cause, status: str) -> dict:
        bug = self.bugs.setdefault(cause.key, _new_bug(cause, status))
        if status == BUG:
            bug["status"] = BUG
        return bug

    def count(self, cause: Cause, verdict, recipe, *, drawn: bool = True) -> None:
        """A case with this cause: drawn, or (``drawn=False``) a candidate of another bug's shrink, which
        counts apart (it is derived from a drawn case) but adds where the bug shows."""
        bug = self.bug(cause, verdict.status)
        bug["cases" if drawn else "shrink_cases"] += 1
        parts = {(f.details or {}).get("gradient") or "out" for f in verdict.findings}
        for key, values in zip(_COUNTED, ([recipe.regime], [recipe.dtype], [recipe.layout], [recipe.causal],
                                          sorted(parts))):
            for value in values:
                bug[key][value] = bug[key].get(value, 0) + 1
        bug["kinds"] = sorted(set(bug["kinds"]) | {f.kind for f in verdict.findings})
        bug["max_ratio"] = _worse(bug["max_ratio"], json_number(verdict.max_ratio))
        if math.isfinite(verdict.max_ratio):
            self.lengths.setdefault(cause.key, []).append((recipe.shapes.n_k, verdict.max_ratio))

    def saved(self, cause: Cause, status: str, entry: dict) -> None:
        """A finding saved for this cause: the smallest one becomes the bug's example."""
        bug = self.bug(cause, status)
        bug["saved"] += 1
        if bug["smallest"] is None or _smaller(entry, bug["smallest"]):
            _take_example(bug, entry)

    def name(self, cause: Cause, entry: dict, model: dict) -> None:
        """The defect models' explanation of a saved finding's case (``Explanation.as_dict()``): on ``entry``, and
        on its bug while ``entry`` is the bug's example; their titles name the model that explains it."""
        entry["model"], entry["title"] = model, titled(cause.title, model)
        bug = self.bugs[cause.key]
        if bug["smallest"] is entry:
            bug["model"], bug["title"] = model, entry["title"]

    def add_diagnosis(self, key: str, line: str) -> None:
        self.bugs[key]["diagnosis"].append(line)

    def as_list(self) -> list[dict]:
        return _ordered(self.bugs.values())


def _worse(a, b):
    """The worse of two error/budget ratios as JSON writes them (None: none seen; NaN is the worst)."""
    values = [from_json_number(x) for x in (a, b) if x is not None]
    if not values:
        return None
    return json_number(math.nan if any(math.isnan(x) for x in values) else max(values))


def _smaller(entry: dict, than: dict) -> bool:
    """A shrunk case before one as found (a complete shrink first), then the fewer elements."""
    def rank(e):
        return (not e.get("shrunk"), not e.get("shrink_complete", True), e.get("elements", math.inf))
    return rank(entry) < rank(than)


def _ordered(bugs) -> list[dict]:
    """BUG before SUSPICIOUS, then the most cases first; ids count from 1 in that order."""
    ordered = sorted(bugs, key=lambda b: (b["status"] != BUG, -b["cases"], b["cause"]))
    return [{"id": i, **{k: v for k, v in b.items() if k != "id"}} for i, b in enumerate(ordered, 1)]


def bugs_with_findings(bugs: list[dict], findings: list[dict]) -> list[dict]:
    """``bugs`` (a worker's last progress report) completed by the saved ``findings`` it reported, some
    of them after that report: a worker that died without its summary still blocks what it found."""
    tally = BugTally()
    tally.bugs = {b["cause"]: {**b, "saved": 0, "smallest": None} for b in bugs}
    for f in findings:
        if "cause" not in f:
            continue
        tally.saved(Cause(f["cause"], f.get("title") or f["cause"]), f["status"], f)
        bug = tally.bugs[f["cause"]]
        if not bug["cases"] and f.get("dtype"):  # no count reached the parent: the finding's own dtype
            bug["dtypes"][f["dtype"]] = bug["dtypes"].get(f["dtype"], 0) + 1
    return tally.as_list()


def combine_bugs(lists: list[list[dict]], sources: list[str] | None = None) -> list[dict]:
    """The distinct bugs of campaigns run side by side: combined by cause, counts summed, the smallest
    example kept (tagged with its source)."""
    combined: dict[str, dict] = {}
    for i, bugs in enumerate(lists):
        for bug in bugs or []:
            smallest = bug.get("smallest")
            if smallest is not None and sources is not None:
                inner = smallest.get("source")  # a combination of combinations keeps every source's name
                smallest = {**smallest, "source": f"{sources[i]}/{inner}" if inner else sources[i]}
            into = combined.get(bug["cause"])
            if into is None:
                combined[bug["cause"]] = {**bug, "smallest": smallest,
                                          **{k: dict(bug.get(k) or {}) for k in _COUNTED}}
                continue
            _combine_into(into, bug, smallest)
    return _ordered(combined.values())


def _combine_into(into: dict, bug: dict, smallest: dict | None) -> None:
    into["status"] = BUG if BUG in (into["status"], bug["status"]) else into["status"]
    into["cases"] += bug["cases"]
    into["shrink_cases"] += bug.get("shrink_cases", 0)
    into["saved"] += bug.get("saved", 0)
    for key in _COUNTED:
        into[key] = dict(Counter(into[key]) + Counter(bug.get(key) or {}))
    into["kinds"] = sorted(set(into["kinds"]) | set(bug.get("kinds") or []))
    into["max_ratio"] = _worse(into["max_ratio"], bug.get("max_ratio"))
    if smallest is not None and (into["smallest"] is None or _smaller(smallest, into["smallest"])):
        into.update(smallest=smallest, diagnosis=list(bug.get("diagnosis") or []), model=bug.get("model"),
                    title=bug["title"])
