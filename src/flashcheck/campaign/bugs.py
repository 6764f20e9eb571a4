"""Distinct bugs: a campaign's failing cases grouped by root cause (:mod:`flashcheck.campaign.causes`).

Each distinct bug keeps how many drawn cases hit it and under which regimes, dtypes, layouts and causal
alignments, the largest error/budget seen, its saved cases, and the smallest of them with its replay
command (a shrunk case before one as found). A campaign's summary and JSON lead with these; the raw
findings follow. Summaries combined from several workers or machines combine their bugs by cause.
"""

from __future__ import annotations

import math
from collections import Counter

from ..judge.verdict import BUG, from_json_number, json_number
from .causes import Cause

__all__ = ["BugTally", "bugs_with_findings", "combine_bugs"]

_COUNTED = ("regimes", "dtypes", "layouts", "causal", "parts")  # counted per case that hits a bug


def _new_bug(cause: Cause, status: str) -> dict:
    return {"cause": cause.key, "title": cause.title, "status": status, "cases": 0, "shrink_cases": 0,
            **{key: {} for key in _COUNTED}, "kinds": [], "max_ratio": None, "diagnosis": [],
            "smallest": None, "saved": 0}


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
            bug["smallest"] = entry
            bug["diagnosis"] = list(entry["diagnosis"])

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
        into["smallest"], into["diagnosis"] = smallest, list(bug.get("diagnosis") or [])
