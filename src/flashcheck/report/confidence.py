"""What a sign-off's cases rule out, what they drew, and what the field's rules would have said of them.

Per kernel, pass and dtype (a cell): the failure rate its judged cases bound (:func:`flashcheck.judge.verdict.rate_bound`), overall
and per value regime; the cases it drew per coverage field; and per anchor rule (flash-attention's,
PyTorch's, the Triton tutorial's, :mod:`flashcheck.judge.anchors`) a 2x2 of flashcheck's verdict against
the rule's on the same outputs. All of it from the campaign's record rows (``RECORD_COLUMNS``), no torch.
"""

from __future__ import annotations

from collections import Counter

from ..campaign.result import RECORD_COLUMNS
from ..judge.verdict import ANCHOR_FAIL, ANCHOR_PASS, CONFIDENCE, PASS, from_json_number, rate_bound

__all__ = ["CONFIDENCE", "anchor_table", "confidence", "drew", "rate_bound", "thin_regimes"]

_AT = {name: i for i, name in enumerate(RECORD_COLUMNS)}
# The 2x2 of one rule: (flashcheck failed the case, the rule failed it) -> its cell.
_QUADRANTS = {(False, False): "both_pass", (True, False): "flashcheck_only", (False, True): "anchor_only",
              (True, True): "both"}


def _failed(row) -> bool:
    return row[_AT["status"]] != PASS  # BUG or SUSPICIOUS: either blocks a sign-off


def _rates(rows: list) -> dict:
    n, failed = len(rows), sum(map(_failed, rows))
    return {"judged": n, "failed": failed, "upper_95": rate_bound(n) if not failed else None,
            "observed": failed / n if n else None}


def confidence(rows: list) -> dict:
    """A cell's judged and failed cases with the rate they bound (``upper_95``, zero failures) or show
    (``observed``), overall and per value regime."""
    regimes: dict = {}
    for r in rows:
        regimes.setdefault(r[_AT["values"]], []).append(r)
    return {**_rates(rows), "by_values": {v: _rates(rs) for v, rs in sorted(regimes.items())}}


def drew(coverage: dict) -> dict:
    """The cell's judged, drawn cases per value of each coverage field (``field -> value -> cases``), the
    values it never drew left out (``never_judged`` names them)."""
    return {name: {v: n for v, n in counts.items() if n} for name, counts in coverage.items()
            if name != "dtype" and any(counts.values())}


def thin_regimes(rows: list, regimes, minimum: int) -> list[tuple[str, int]]:
    """``(regime, judged cases)`` for each of ``regimes`` that the rows hold fewer than ``minimum`` of."""
    counts = Counter(r[_AT["values"]] for r in rows)
    return [(v, counts[v]) for v in sorted(regimes) if counts[v] < minimum]


def anchor_table(rows: list) -> dict:
    """Per anchor rule, flashcheck's verdict against the rule's on the same cases: ``both_pass``,
    ``flashcheck_only`` (the rule missed it), ``anchor_only`` (flashcheck: legal rounding; the rule's false
    alarm), ``both``, ``not_applicable``; and the largest err/budget of each disagreement."""
    table: dict = {}
    for r in rows:
        said = r[_AT["anchors"]] if len(r) > _AT["anchors"] else None
        for rule, word in (said or {}).items():
            entry = table.setdefault(rule, {**dict.fromkeys(_QUADRANTS.values(), 0), "not_applicable": 0,
                                            "max_ratio": {"flashcheck_only": None, "anchor_only": None}})
            if word not in (ANCHOR_PASS, ANCHOR_FAIL):
                entry["not_applicable"] += 1
                continue
            cell = _QUADRANTS[(_failed(r), word == ANCHOR_FAIL)]
            entry[cell] += 1
            if cell in entry["max_ratio"]:
                entry["max_ratio"][cell] = _larger(entry["max_ratio"][cell], r[_AT["ratio"]])
    return table


def _larger(a, b):
    """The larger of two recorded err/budgets (a number, "nan", "inf" or None): non-finite wins."""
    if b is None or a in ("nan", "inf"):
        return a
    if a is None or isinstance(b, str):
        return b
    return max(from_json_number(a), from_json_number(b))
