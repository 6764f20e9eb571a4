"""A campaign's summary: :class:`CampaignSummary`, the one record of what a campaign (or several, combined)
found, and its JSON (``fuzz --json``, a sign-off's ``campaigns/*.json``, ``flashcheck merge``).

Its fields are the JSON's keys, in the JSON's order: :meth:`CampaignSummary.as_dict` writes it and
:meth:`CampaignSummary.from_dict` reads it back, checked (:func:`load_summary` from a file). A summary
written by an older flashcheck lacks some keys: they read as None and are not written back
(``absent``); keys a newer one added are kept as they are (``extra``), so that combining summaries
(:mod:`.combine`) still combines them by their type. Nested parts stay as JSON has them: the distinct bugs
(:mod:`.bugs`), the findings' entries (:func:`flashcheck.campaign.result.finding_entry`), the sources of a
combined summary. Readable without torch or hypothesis.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidArgument

__all__ = ["CampaignSummary", "load_summary", "add_quantization_error"]

# The keys every summary has, with their JSON types; the others may be missing from an older one.
_REQUIRED = {"verdict": str, "kernel": (str, list), "device": (str, list), "preset": (str, list), "cases": int,
             "examples": int, "elapsed_s": (int, float), "counts": dict, "findings": list, "stopped": (str, list),
             "time_split_s": dict, "max_ratio_by_dtype": dict, "skipped": dict, "bug_signatures": dict,
             "info": dict, "notes": list, "isolation": (str, list), "timeouts": int, "worker_restarts": int}
# Written only where they hold something: a campaign's records, its quantization error, a combined summary's
# sources, --jobs, the workers lost before their share was done.
_WHEN_SET = ("record_columns", "records", "quantization_error", "sources", "jobs", "lost")
_FIX = "Pass JSON summaries written by `flashcheck fuzz --json PATH` (or by `flashcheck merge --json`)."


@dataclass(frozen=True, kw_only=True)
class CampaignSummary:
    """What a campaign found, as its JSON has it. A combined summary's ``kernel``, ``device``, ``preset``,
    ``seed``, ``stopped``, ... hold the list of the sources' values where they differ."""

    verdict: str
    bugs: list = field(default_factory=list)  # the distinct bugs, by cause (flashcheck.campaign.bugs)
    kernel: str | list | None = None
    device: str | list | None = None
    preset: str | list | None = None
    seed: int | list | None = None
    cases: int = 0                     # every case checked, shrink candidates included
    examples: int = 0                  # the cases hypothesis generated (what max_examples counts)
    elapsed_s: float = 0.0
    cases_per_s: float | None = None
    first_case_s: float | None = None  # seconds from the start to the first judged case
    steady_cases_per_s: float | None = None  # from the first judged case to the end
    time_split_s: dict = field(default_factory=dict)  # part -> seconds (flashcheck.campaign.result.TIMED_PARTS)
    counts: dict = field(default_factory=dict)  # by_status, by_dtype, by_regime -> value -> cases
    max_ratio_by_dtype: dict = field(default_factory=dict)
    max_ratio_by_gradient: dict | None = field(default_factory=dict)  # dtype -> gradient -> largest err/budget
    stopped: str | list | None = None  # max_examples, time_budget, bug_found, interrupted, worker_failed, ...
    properties: dict | None = None     # the exact properties checked, their share of the time, their cases
    isolation: str | list | None = None  # "worker" or "in-process"
    case_timeout_s: float | list | None = None
    keep_going: bool | list | None = None
    backward: bool | list | None = None
    skipped: dict = field(default_factory=dict)          # kind ("oom", "unsupported") -> cases
    skipped_reasons: dict | None = field(default_factory=dict)  # "kind: reason" -> cases
    compilations: int | None = 0
    timeouts: int = 0
    worker_restarts: int = 0
    bug_signatures: dict = field(default_factory=dict)  # cause -> drawn failing cases
    notes: list = field(default_factory=list)
    info: dict = field(default_factory=dict)  # information, not findings (batch invariance)
    coverage: dict | None = field(default_factory=dict)  # dtype -> field -> value -> judged drawn cases
    findings: list = field(default_factory=list)  # one entry per saved case
    case_log_sha256: str | None = None
    case_log: list | None = None  # every case run, in order (None once combined)
    record_columns: list | None = None  # with records: one row per drawn, judged case
    records: list | None = None
    # quantized inputs: dtype -> {"cases", "min_cosine", "max_rel"}, the quantization error of a sample of the drawn
    # cases (flashcheck.inputs.quantization_error), never part of the verdict
    quantization_error: dict | None = None
    sources: list | None = None  # a combined summary: one entry per source
    jobs: int | None = None  # fuzz --jobs N
    # workers that ended before their share was done: which, after how many cases, how, and who took the rest
    lost: list | None = None
    extra: dict = field(default_factory=dict)  # keys this version does not know, as read
    absent: frozenset = frozenset()  # keys the JSON it was read from lacked: not written back

    def as_dict(self) -> dict:
        """The JSON summary."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("extra", "absent") or f.name in self.absent or (f.name in _WHEN_SET and value is None):
                continue
            out[f.name] = value
        return {**out, **self.extra}

    @property
    def judged(self) -> int:
        """Cases with a verdict (not skipped)."""
        return sum(self.counts.get("by_status", {}).values())

    @classmethod
    def from_dict(cls, data, source: str) -> "CampaignSummary":
        """The summary of JSON ``data``; :class:`InvalidArgument` naming ``source`` unless it is one."""
        _validate(data, source)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "absent"}
        return cls(**{k: v for k, v in data.items() if k in known},
                   **{k: None for k in known - set(data) if k != "verdict"},
                   extra={k: v for k, v in data.items() if k not in known},
                   absent=frozenset(known - set(data) - set(_WHEN_SET)))


def add_quantization_error(into: dict, dtype: str, *, cases: int, min_cosine: float, max_rel: float) -> None:
    """Fold ``cases`` sampled cases' quantization error into ``into``'s entry for ``dtype`` (a summary's
    ``quantization_error``): cases summed, the least cosine, the largest error."""
    seen = into.setdefault(dtype, {"cases": 0, "min_cosine": 1.0, "max_rel": 0.0})
    seen.update(cases=seen["cases"] + cases, min_cosine=min(seen["min_cosine"], min_cosine),
                max_rel=max(seen["max_rel"], max_rel))


def load_summary(path: str | Path) -> CampaignSummary:
    """The campaign summary in the JSON file ``path``; :class:`InvalidArgument` naming it if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InvalidArgument("summary", str(path), f"cannot be read ({exc.strerror or exc})", _FIX) from None
    except ValueError as exc:  # not JSON, or not UTF-8 text
        raise InvalidArgument("summary", str(path), f"not JSON ({exc})", _FIX) from None
    return CampaignSummary.from_dict(data, str(path))


def _validate(summary, source: str) -> None:
    if not isinstance(summary, dict):
        raise InvalidArgument("summary", source, f"not a flashcheck summary (a JSON {type(summary).__name__}, "
                              "expected an object)", _FIX)
    missing = sorted(k for k in _REQUIRED if k not in summary)
    if missing:
        raise InvalidArgument("summary", source, f"not a flashcheck summary (no {', '.join(missing)})", _FIX)
    wrong = sorted(k for k, t in _REQUIRED.items() if not isinstance(summary[k], t) or isinstance(summary[k], bool))
    if not wrong:  # and inside: one object per finding, one per count
        wrong += ["findings"] if not all(isinstance(f, dict) for f in summary["findings"]) else []
        wrong += ["counts"] if not all(isinstance(c, dict) for c in summary["counts"].values()) else []
    if wrong:
        raise InvalidArgument("summary", source, f"not a flashcheck summary (wrong type of {', '.join(wrong)})", _FIX)
