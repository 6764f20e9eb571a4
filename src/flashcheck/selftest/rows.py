"""The self-test's rows (subject x dtype): when each detector (flashcheck, the field's rules) first flagged a
subject, its margins, and a row's cases cut into chunks (``selftest --jobs``) and combined back into the row
one process gives. Readable without torch: ``selftest --table`` prints saved rows."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..contract.features import FEATURES
from ..judge.verdict import from_json_number, json_number

__all__ = ["BUG_FIRST_CHUNK", "DEFAULT_CHUNK", "Detection", "Row", "all_fired", "combine_chunks", "fired_detectors",
           "row_cases", "row_chunks"]


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
    """Whether every detector is done with ``row``, counting those ``fired`` (by earlier chunks) too."""
    done = fired_detectors(row) | set(fired)
    return "flashcheck" in done and all(key in done for key in row.anchors)


# ------------------------------------------------------------------------------------------------
# Chunks: slices of a row's cases, run apart (``selftest --jobs N``) and combined back into its row
# ------------------------------------------------------------------------------------------------

DEFAULT_CHUNK = 50      # cases per chunk (``selftest --chunk``)
BUG_FIRST_CHUNK = 12    # a planted bug's first chunk: most are caught by then


def row_chunks(correct: bool, cases: int, bug_cases: int, chunk: int = DEFAULT_CHUNK,
               first_bug_chunk: int = BUG_FIRST_CHUNK) -> list[tuple[int, int]]:
    """A row's cases as ``[start, stop)`` slices, in order: ``chunk`` cases each; a planted bug's first
    slice holds at most ``first_bug_chunk`` (its later slices run only while it is not caught)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    total = max(row_cases(correct, cases, bug_cases), 0)
    if total == 0:
        return [(0, 0)]
    bounds = [0, min(total, chunk if correct else min(chunk, first_bug_chunk))]
    while bounds[-1] < total:
        bounds.append(min(bounds[-1] + chunk, total))
    return list(zip(bounds, bounds[1:]))


def _combine_detections(dets: list[Detection]) -> Detection:
    flagged = [d for d in dets if d.first_case is not None]
    first = min(flagged, key=lambda d: d.first_case) if flagged else None
    how = first.how if first else ("n/a" if any(d.how == "n/a" for d in dets) else "")
    return Detection(first.first_case if first else None, how, sum(d.false_alarms for d in dets))


def combine_chunks(chunks: list[Row]) -> Row:
    """One row from the rows of its chunks (any order): what the whole row gives on the same cases.

    Cases, suspicious cases, false alarms and seconds add up; the largest ratio and the smallest caught
    ratio are kept; each detector's first case is the smallest of the chunks' (with its "how"); stopped
    if any chunk was.
    """
    if not chunks:
        raise ValueError("no chunks to combine")
    head = chunks[0]
    return Row(head.variant, head.correct, head.area, head.dtype,
               cases=sum(c.cases for c in chunks),
               flashcheck=_combine_detections([c.flashcheck for c in chunks]),
               anchors={key: _combine_detections([c.anchors[key] for c in chunks]) for key in head.anchors},
               max_ratio=max(c.max_ratio for c in chunks),
               min_caught_ratio=min(c.min_caught_ratio for c in chunks),
               suspicious=sum(c.suspicious for c in chunks),
               seconds=sum(c.seconds for c in chunks),
               stopped=any(c.stopped for c in chunks),
               gradient_max={k: max(c.gradient_max.get(k, 0.0) for c in chunks)
                             for k in sorted({k for c in chunks for k in c.gradient_max})},
               errors=sum(c.errors for c in chunks),
               features={k: sum(c.features.get(k, 0) for c in chunks)
                         for k in FEATURES if any(k in c.features for c in chunks)})


def row_cases(correct: bool, cases: int, bug_cases: int) -> int:
    """The most cases a row runs: ``cases`` for a correct kernel, ``bug_cases`` for a planted bug (which
    stops earlier once every detector fired), each whatever the other is."""
    return cases if correct else bug_cases
