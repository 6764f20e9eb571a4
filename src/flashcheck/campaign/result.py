"""What a campaign counts while it runs (:class:`CampaignResult`), and the summary it gives
(:meth:`CampaignResult.summary`, a :class:`~flashcheck.campaign.summary.CampaignSummary`).

Apart from the run that fills it, so that readers of summaries (combinations, sign-off reports) need
neither torch nor hypothesis to load it.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ..files import replay_command
from ..judge.verdict import Verdict, json_number, keep_largest, run_verdict
from .bugs import BugTally
from .causes import Cause
from .summary import CampaignSummary, add_quantization_error

__all__ = ["CampaignResult", "MAX_SKIP_REASONS", "MODELS", "OTHER_SKIP_REASONS", "RECORD_COLUMNS", "TIMED_PARTS",
           "TRIAGE", "count_skip_reasons", "finding_entry", "keep_finding", "never_judged", "properties_summary",
           "record_row", "shrink_state"]

# The parts of a case's time a verdict reports; "compile" (Triton's compilations) is part of "kernel".
# "generation" draws the tensors (in the worker process, or in-process); the summary's "draw" part is the
# campaign's own time between cases: hypothesis choosing the recipe, counting, saving.
TIMED_PARTS = ("generation", "transfer", "kernel", "compile", "oracle", "properties", "envelope", "anchors")
# Reruns of failing non-contiguous cases in the contiguous layout, to name their cause.
TRIAGE = "triage"
# The defect models run once per distinct bug, to name it (campaign.naming).
MODELS = "models"
# One row per drawn, judged case when a campaign keeps records (a sign-off's plots and coverage).
# "anchors": each of the field's rules (judge.anchors) on the same output, "pass", "fail" or "n/a"; None
# where none judged it (the worker died on the case).
RECORD_COLUMNS = ("dtype", "values", "mask", "causal", "layout", "n_q", "n_k", "head_dim", "status", "ratio", "cause",
                  "anchors")
MAX_SKIP_REASONS = 20  # distinct skip reasons a summary keeps; the others count together
OTHER_SKIP_REASONS = "(other reasons)"


@dataclass
class CampaignResult:
    verdict: str
    kernel: str
    device: str
    preset: str
    seed: int | None
    cases: int = 0     # every case checked, shrink candidates included
    examples: int = 0  # the cases hypothesis generated (what max_examples counts)
    elapsed: float = 0.0
    first_case: float | None = None  # seconds from the campaign's start (started_at) to its first judged case
    # Cases/s from the first judged case to the end: startup left out, the rate a long campaign approaches.
    steady_rate: float | None = None
    # generation (hypothesis and the regimes), transfer (the case to the worker process and onto the device, the
    # verdict back, and what else a worker's call spent outside the other parts), kernel (the first call),
    # compile (Triton's compilations,
    # included in kernel), oracle (reference and budget), properties (the exact properties' reruns),
    # envelope (the twin's tilings, for SUSPICIOUS), anchors (the field's rules on the same output: sign-offs),
    # triage (TRIAGE), models (MODELS).
    time_split: dict = field(default_factory=lambda: dict.fromkeys(("draw",) + TIMED_PARTS + (TRIAGE, MODELS), 0.0))
    by_status: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    by_regime: Counter = field(default_factory=Counter)
    max_ratio_by_dtype: dict = field(default_factory=dict)
    max_ratio_by_gradient: dict = field(default_factory=dict)  # the backward pass: dtype -> gradient -> largest
    findings: list = field(default_factory=list)
    stopped: str = "max_examples"
    isolation: str = "in-process"
    case_timeout: float | None = None
    keep_going: bool = False
    backward: bool = False  # the cases checked the backward pass
    skipped: Counter = field(default_factory=lambda: Counter(oom=0))  # by kind: "oom", "unsupported"
    skipped_reasons: Counter = field(default_factory=Counter)  # "kind: reason" -> cases (count_skip_reasons)
    compilations: int = 0  # Triton compilations during the kernel's calls
    timeouts: int = 0
    worker_restarts: int = 0
    bug_signatures: Counter = field(default_factory=Counter)  # drawn failing cases per cause (its key)
    bugs: BugTally = field(default_factory=BugTally)  # the distinct bugs, by cause
    # Information, not findings: e.g. cases whose last sequence gave other bits alone than in its batch.
    info: Counter = field(default_factory=lambda: Counter(batch_dependent=0, batch_checked=0))
    case_log: list = field(default_factory=list)  # every case run, in order: the same seed gives the same log
    notes: list = field(default_factory=list)
    records: list | None = None  # rows of RECORD_COLUMNS, when the campaign keeps them
    quantization: dict = field(default_factory=dict)  # dtype -> sampled quantization error (summary's)
    # the properties checked, their share of the time, the cases each judged (campaign.share.PropertyShare)
    properties: dict = field(default_factory=lambda: {"checked": []})
    # dtype -> coverage field -> value -> drawn cases judged (every value the campaign could draw, 0 if none)
    coverage: dict = field(default_factory=dict)

    def count_case(self, verdict: Verdict, logged: str, recipe, *, drawn: bool) -> None:
        """Count one case run (``drawn``: not a shrink candidate); ``logged`` is its line in the case log."""
        for part in TIMED_PARTS:
            self.time_split[part] += verdict.elapsed.get(part, 0.0)
        self.compilations += getattr(verdict, "compilations", 0)
        self.cases += 1
        self.case_log.append(logged)
        self.by_dtype[recipe.dtype] += 1
        self.by_regime[recipe.regime] += 1
        self.examples += drawn
        if verdict.skipped:  # out of memory, unsupported: not the kernel's fault, and no verdict on it
            self.skipped[verdict.skipped.split(":")[0]] += 1
            count_skip_reasons(self.skipped_reasons, {verdict.skipped: 1})
            return
        self.by_status[verdict.status] += 1
        if drawn:
            self._cover(recipe)
        if drawn and "batch" in verdict.properties:
            self.info["batch_checked"] += 1
            self.info["batch_dependent"] += any(n.startswith("batch-dependent") for n in verdict.notes)
        self.timeouts += any(f.kind == "timeout" for f in verdict.findings)
        if math.isfinite(verdict.max_ratio):
            previous = self.max_ratio_by_dtype.get(recipe.dtype, 0.0)
            self.max_ratio_by_dtype[recipe.dtype] = max(previous, verdict.max_ratio)
        if verdict.ratios:  # dq, dk, dv (dbias, dsinks) each judged apart
            keep_largest(self.max_ratio_by_gradient.setdefault(recipe.dtype, {}), verdict.ratios)

    def count_quantization(self, dtype: str, error) -> None:
        """Add one sampled case's quantization error (a QuantizationError) to its dtype's: the least cosine and the
        largest error relative to the output's largest magnitude."""
        add_quantization_error(self.quantization, dtype, cases=1, min_cosine=error.cosine, max_rel=error.max_rel)

    def _cover(self, recipe) -> None:
        from ..inputs.covering import POOL_FIELDS, shape_classes  # hypothesis: summaries are read without it

        counts = self.coverage.setdefault(recipe.dtype, {})
        for name in POOL_FIELDS:
            inner = counts.setdefault(name, {})
            inner[getattr(recipe, name)] = inner.get(getattr(recipe, name), 0) + 1
        shapes = counts.setdefault("shape", {})
        for c in shape_classes(recipe.shapes):
            shapes[c] = shapes.get(c, 0) + 1

    def never_judged(self, dtype: str) -> list[str]:
        """``field=value`` for each value of ``dtype``'s coverage that no drawn case was judged with."""
        return never_judged(self.coverage.get(dtype, {}))

    def conclude(self) -> None:
        """The verdict, and the diagnosis of bugs whose error grows with the number of keys."""
        from ..judge.diagnose import (
            growth_with_length,  # torch: only a campaign concludes
        )

        for key, points in self.bugs.lengths.items():  # a defect that accumulates along the keys says so
            growth = growth_with_length(points)
            if growth:
                self.bugs.add_diagnosis(key, growth)
                for entry in self.findings:
                    if entry["cause"] == key:
                        entry["diagnosis"] = list(entry["diagnosis"]) + [growth]
        # PASS needs a judged case: with none (all skipped, or no case at all) the verdict is NO_CASES.
        self.verdict = run_verdict(self.findings, self.by_status)

    def summary(self) -> CampaignSummary:
        """The campaign's summary, as it stands."""
        log_hash = hashlib.sha256("\n".join(self.case_log).encode()).hexdigest()
        return CampaignSummary(
            verdict=self.verdict, bugs=self.bugs.as_list(), kernel=self.kernel, device=self.device, preset=self.preset,
            seed=self.seed, cases=self.cases, examples=self.examples, elapsed_s=round(self.elapsed, 3),
            cases_per_s=round(self.cases / self.elapsed, 3) if self.elapsed > 0 else None,
            first_case_s=round(self.first_case, 3) if self.first_case is not None else None,
            steady_cases_per_s=round(self.steady_rate, 3) if self.steady_rate is not None else None,
            time_split_s={k: round(v, 3) for k, v in self.time_split.items()},
            counts={"by_status": dict(self.by_status), "by_dtype": dict(self.by_dtype),
                    "by_regime": dict(self.by_regime)},
            max_ratio_by_dtype={k: json_number(v) for k, v in self.max_ratio_by_dtype.items()},
            max_ratio_by_gradient={dtype: {k: json_number(v) for k, v in ratios.items()}
                                   for dtype, ratios in self.max_ratio_by_gradient.items()},
            stopped=self.stopped, properties=self.properties, isolation=self.isolation,
            case_timeout_s=self.case_timeout, keep_going=self.keep_going, backward=self.backward,
            skipped=dict(self.skipped), skipped_reasons=dict(self.skipped_reasons), compilations=self.compilations,
            timeouts=self.timeouts, worker_restarts=self.worker_restarts, bug_signatures=dict(self.bug_signatures),
            notes=self.notes, info=dict(self.info), coverage=self.coverage, findings=self.findings,
            case_log_sha256=log_hash, case_log=self.case_log,
            record_columns=None if self.records is None else list(RECORD_COLUMNS), records=self.records,
            quantization_error=self.quantization or None)

    def as_dict(self) -> dict:
        """The JSON summary."""
        return self.summary().as_dict()


def count_skip_reasons(counter: Counter, reasons: dict) -> None:
    """Add ``reasons`` (reason -> cases) to ``counter``, keeping at most ``MAX_SKIP_REASONS`` distinct ones:
    reasons past that count under ``OTHER_SKIP_REASONS`` (an OOM message naming its size differs per case)."""
    for reason, n in reasons.items():
        reason = reason[:200]
        key = reason if reason in counter or len(counter.keys() - {OTHER_SKIP_REASONS}) < MAX_SKIP_REASONS \
            else OTHER_SKIP_REASONS
        counter[key] += n


def record_row(recipe, verdict: Verdict, cause: Cause | None) -> list:
    """One row of RECORD_COLUMNS for a drawn, judged case."""
    s = recipe.shapes
    ratio = verdict.max_ratio
    return [recipe.dtype, recipe.values, recipe.mask, recipe.causal, recipe.layout, s.n_q, s.n_k, s.head_dim,
            verdict.status, json_number(round(ratio, 6) if math.isfinite(ratio) else ratio),
            None if cause is None else cause.key, dict(verdict.anchors) or None]


def finding_entry(verdict: Verdict, case, path: Path, cause: Cause, *, shrunk: bool,
                   device: str) -> dict:
    return {
        "status": verdict.status,
        "cause": cause.key,
        "title": cause.title,
        "dtype": case.dtype,
        "kinds": sorted({f.kind for f in verdict.findings}),
        "diagnosis": [f.diagnosis for f in verdict.findings],
        "max_ratio": json_number(verdict.max_ratio),
        "case": verdict.case,
        "regime": verdict.regime,
        "elements": case.q.numel() + case.k.numel() + case.v.numel(),
        "shrunk": shrunk,
        "path": str(path),
        "replay": replay_command(path, device=device),
    }


def keep_finding(findings: list, entry: dict) -> None:
    """``entry`` in ``findings``: in place of the one saved at its path (sent again once its bug was named)."""
    at = next((i for i, f in enumerate(findings) if f.get("path") == entry.get("path")), None)
    if at is None:
        findings.append(entry)
    else:
        findings[at] = entry


def shrink_state(entry: dict) -> str:
    """How a saved case (a finding's summary entry) stands to shrinking, for people: ``shrunk`` only for a
    case hypothesis shrank."""
    if entry.get("shrunk"):
        return "shrunk" if entry.get("shrink_complete", True) else "partly shrunk"
    note = entry.get("shrink_note")
    return f"as found, not shrunk: {note}" if note else "as found"


def never_judged(coverage: dict) -> list[str]:
    """``field=value`` for each value of one dtype's coverage (field -> value -> judged cases) at 0."""
    return [f"{name}={value}" for name, counts in coverage.items() for value, n in counts.items() if not n]


def properties_summary(checked: list, share: float, cases: dict, seconds: float, elapsed: float) -> dict:
    """The summary's ``properties``: which, within what share, the cases each judged, their time."""
    return {"checked": checked, "share": share, "cases": cases, "seconds": round(seconds, 3),
            "time_share": round(seconds / elapsed, 3) if elapsed > 0 else None}
