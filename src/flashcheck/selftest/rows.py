"""The self-test's rows (subject x dtype): when each detector (flashcheck, the field's rules) first flagged a
subject, its margins, and a row's cases cut into parts (``selftest --jobs``) and combined back into the row
one process gives. Readable without torch: ``selftest --table`` prints saved rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..contract.features import FEATURES
from ..judge.verdict import from_json_number, json_number

__all__ = ["BUG_FIRST_PART", "DEFAULT_PART", "Detection", "Row", "all_fired", "combine_parts", "fired_detectors",
           "row_cases", "row_parts"]


@dataclass
class Detection:
    """When one detector (flashcheck or an anchor rule) first flagged a subject, if it did."""

    first_case: int | None = None
    how: str = ""
    false_alarms: int = 0

    def flag(self, index: int, how: str) -> None:
        if self.first_case is None:
            self.first_case, self.how = index, how

    def as_dict(self) -> dict:
        return {"first_case": self.first_case, "how": self.how, "false_alarms": self.false_alarms}

    @classmethod
    def from_dict(cls, d: dict) -> "Detection":
        return cls(d["first_case"], d["how"], d["false_alarms"])


@dataclass
class Row:
    """One subject in one dtype: what each detector made of its cases. ``variant`` is the subject's name
    (the key ``selftest --json`` writes, the table's first column)."""

    variant: str
    correct: bool
    area: str
    dtype: str
    cases: int = 0
    flashcheck: Detection = field(default_factory=Detection)
    anchors: dict = field(default_factory=dict)  # "rule/inputs" -> Detection
    max_ratio: float = 0.0  # correct subjects: the margin
    min_caught_ratio: float = math.inf  # planted bugs: the closest a caught case came to the budget
    suspicious: int = 0
    seconds: float = 0.0
    stopped: bool = False  # the time budget ran out before the row's cases did
    gradient_max: dict = field(default_factory=dict)  # the backward pass: largest err/budget of dq, dk, dv
    errors: int = 0  # cases flashcheck itself failed on (an exception in judging, not the kernel's)
    features: dict = field(default_factory=dict)  # variant feature -> judged cases that used it

    def as_dict(self) -> dict:
        return {"variant": self.variant, "correct": self.correct, "area": self.area, "dtype": self.dtype,
                "cases": self.cases, "flashcheck": self.flashcheck.as_dict(),
                "anchors": {k: v.as_dict() for k, v in self.anchors.items()},
                "max_ratio": json_number(self.max_ratio), "min_caught_ratio": json_number(self.min_caught_ratio),
                "suspicious": self.suspicious, "seconds": round(self.seconds, 2), "stopped": self.stopped,
                "gradient_max": {k: json_number(v) for k, v in self.gradient_max.items()}, "errors": self.errors,
                "features": dict(self.features)}

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        """A row saved by ``as_dict`` (``selftest --json``), so shards of one run print as one table."""
        return cls(d["variant"], d["correct"], d["area"], d["dtype"], d["cases"],
                   Detection.from_dict(d["flashcheck"]), {k: Detection.from_dict(v) for k, v in d["anchors"].items()},
                   from_json_number(d["max_ratio"]), from_json_number(d["min_caught_ratio"]), d["suspicious"], d["seconds"],
                   d.get("stopped", False), {k: from_json_number(v) for k, v in d.get("gradient_max", {}).items()},
                   d.get("errors", 0), dict(d.get("features", {})))


def fired_detectors(row: Row) -> frozenset:
    """The detectors done with this row: flashcheck once it flagged, an anchor once it flagged or found
    itself undefined ("n/a"). A planted bug's row ends once they all are."""
    done = {key for key, det in row.anchors.items() if det.first_case or det.how == "n/a"}
    return frozenset(done | ({"flashcheck"} if row.flashcheck.first_case else set()))


def all_fired(row: Row, fired=()) -> bool:
    """Whether every detector is done with ``row``, counting those ``fired`` (by earlier parts) too."""
    done = fired_detectors(row) | set(fired)
    return "flashcheck" in done and all(key in done for key in row.anchors)


# ------------------------------------------------------------------------------------------------
# Parts: slices of a row's cases, run apart (``selftest --jobs N``) and combined back into its row
# -----------------------------------------------------------------------------------------------

DEFAULT_PART = 50      # cases per part (``selftest --chunk``)
BUG_FIRST_PART = 12    # a planted bug's first part: most are caught by then


def row_parts(correct: bool, cases: int, bug_cases: int, size: int = DEFAULT_PART,
              first_bug_size: int = BUG_FIRST_PART) -> list[tuple[int, int]]:
    """A row's cases as ``[start, stop)`` slices, in order: ``size`` cases each; a planted bug's first
    slice holds at most ``first_bug_size`` (its later slices run only while it is not caught)."""
    if size < 1:
        raise ValueError(f"a part holds at least 1 case, got {size}")
    total = max(row_cases(correct, cases, bug_cases), 0)
    if total == 0:
        return [(0, 0)]
    bounds = [0, min(total, size if correct else min(size, first_bug_size))]
    while bounds[-1] < total:
        bounds.append(min(bounds[-1] + size, total))
    return list(zip(bounds, bounds[1:]))


def _combine_detections(dets: list[Detection]) -> Detection:
    flagged = [d for d in dets if d.first_case is not None]
    first = min(flagged, key=lambda d: d.first_case) if flagged else None
    how = first.how if first else ("n/a" if any(d.how == "n/a" for d in dets) else "")
    return Detection(first.first_case if first else None, how, sum(d.false_alarms for d in dets))


def combine_parts(parts: list[Row]) -> Row:
    """One row from the rows of its parts (any order): what the whole row gives on the same cases.

    Cases, suspicious cases, false alarms and seconds add up; the largest ratio and the smallest caught
    ratio are kept; each detector's first case is the smallest of the parts' (with its "how"); stopped
    if any part was.
    """
    if not parts:
        raise ValueError("no parts to combine")
    head = parts[0]
    return Row(head.variant, head.correct, head.area, head.dtype,
               cases=sum(c.cases for c in parts),
               flashcheck=_combine_detections([c.flashcheck for c in parts]),
               anchors={key: _combine_detections([c.anchors[key] for c in parts]) for key in head.anchors},
               max_ratio=max(c.max_ratio for c in parts),
               min_caught_ratio=min(c.min_caught_ratio for c in parts),
               suspicious=sum(c.suspicious for c in parts),
               seconds=sum(c.seconds for c in parts),
               stopped=any(c.stopped for c in parts),
               gradient_max={k: max(c.gradient_max.get(k, 0.0) for c in parts)
                             for k in sorted({k for c in parts for k in c.gradient_max})},
               errors=sum(c.errors for c in parts),
               features={k: sum(c.features.get(k, 0) for c in parts)
                         for k in FEATURES if any(k in c.features for c in parts)})


def row_cases(correct: bool, cases: int, bug_cases: int) -> int:
    """The most cases a row runs: ``cases`` for a correct kernel, ``bug_cases`` for a planted bug (which
    stops earlier once every detector fired), each whatever the other is."""
    return cases if correct else bug_cases
