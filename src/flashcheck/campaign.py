"""Fuzzing campaigns: hypothesis draws recipes, flashcheck checks each case, findings are saved at once.

A campaign runs a kernel over cases drawn from a preset's regimes, shrinks the first failing case to a
small one, and writes every finding to the corpus directory the moment it is found (first the case as
found, then the shrunk one), so an interrupted campaign loses nothing. The summary is JSON with the
verdict, counts per regime and dtype, throughput and one entry per finding with its replay command.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase

from .case import AttentionCase
from .check import check
from .errors import InvalidArgument
from .presets import Preset
from .properties import PROPERTIES, PROPERTY_EVERY, properties_for
from .spec import Kernel
from .strategies import Recipe, recipes
from .verdict import BUG, PASS, SUSPICIOUS, Verdict, json_number, worst_status

__all__ = ["CampaignResult", "run_campaign", "save_finding"]


class _FoundBug(Exception):
    def __init__(self, verdict: Verdict, case: AttentionCase):
        super().__init__(verdict.status)
        self.verdict = verdict
        self.case = case


class _Stop(Exception):
    """The time budget ran out or the user interrupted: end the campaign, keep what was found."""


@dataclass
class CampaignResult:
    verdict: str
    kernel: str
    device: str
    preset: str
    seed: int | None
    cases: int = 0
    elapsed: float = 0.0
    time_split: dict = field(default_factory=lambda: {"generation": 0.0, "kernel": 0.0, "oracle": 0.0})
    by_status: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    by_regime: Counter = field(default_factory=Counter)
    max_ratio_by_dtype: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)
    stopped: str = "max_examples"

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict, "kernel": self.kernel, "device": self.device, "preset": self.preset,
            "seed": self.seed, "cases": self.cases, "elapsed_s": round(self.elapsed, 3),
            "cases_per_s": round(self.cases / self.elapsed, 3) if self.elapsed > 0 else None,
            "time_split_s": {k: round(v, 3) for k, v in self.time_split.items()},
            "counts": {"by_status": dict(self.by_status), "by_dtype": dict(self.by_dtype),
                       "by_regime": dict(self.by_regime)},
            "max_ratio_by_dtype": {k: json_number(v) for k, v in self.max_ratio_by_dtype.items()}, "stopped": self.stopped,
            "properties": {"checked": list(PROPERTIES), "every_nth_case": PROPERTY_EVERY},
            "findings": self.findings,
        }


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")[:60]


def save_finding(corpus: Path, verdict: Verdict, case: AttentionCase, *, label: str) -> Path:
    """Save a failing case under ``corpus`` with its verdict; returns the JSON path."""
    kinds = "+".join(sorted({f.kind for f in verdict.findings})) or verdict.status.lower()
    digest = hashlib.sha1(json.dumps(case.provenance.get("recipe", case.describe()), sort_keys=True,
                                     default=str).encode()).hexdigest()[:10]
    stem = corpus / f"{_slug(verdict.kernel)}-{kinds}-{label}-{digest}"
    provenance = dict(case.provenance)
    provenance["verdict"] = verdict.as_dict()
    saved = AttentionCase.create(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                                 attn_mask=case.attn_mask, layout=case.layout, provenance=provenance)
    _, json_path = saved.save(stem)
    return json_path


def run_campaign(kernel: Kernel, *, device: str, preset: Preset, dtypes=None, max_examples: int | None = None,
                 time_budget: float | None = None, seed: int | None = None, corpus: str | Path = "flashcheck-corpus",
                 database: str | Path | None = None, progress=None) -> CampaignResult:
    """Run one campaign; never raises for what the kernel does (that is a finding)."""
    corpus = Path(corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    max_examples = max_examples or preset.max_examples
    time_budget = time_budget if time_budget is not None else preset.time_budget
    if dtypes is None:
        dtypes = preset.dtypes
    dtypes = [d for d in dtypes if d in kernel.spec.dtypes]
    if not dtypes:
        raise InvalidArgument("dtype", list(dtypes), f"kernel {kernel.name} supports only {kernel.spec.dtypes}",
                              "Pick a dtype the kernel supports.")
    strategy = recipes(spec=kernel.spec, dtypes=dtypes, **preset.strategy_options())
    result = CampaignResult(verdict=PASS, kernel=kernel.name, device=str(device), preset=preset.name, seed=seed)
    start = time.monotonic()
    deadline = start + time_budget if time_budget else math.inf
    first_saved: set[str] = set()
    stop_reason: list[str] = []
    last_end = [time.monotonic()]

    def body(recipe: Recipe):
        if stop_reason or time.monotonic() > deadline:
            stop_reason[:1] = stop_reason or ["time_budget"]
            raise _Stop()
        t0 = time.monotonic()
        case = recipe.build(kernel=kernel.name)
        result.time_split["generation"] += time.monotonic() - t0 + (t0 - last_end[0])
        verdict = check(kernel, case, device=device, properties=properties_for(recipe.seed))
        result.time_split["kernel"] += verdict.elapsed.get("kernel", 0.0)
        result.time_split["oracle"] += verdict.elapsed.get("oracle", 0.0)
        last_end[0] = time.monotonic()
        result.cases += 1
        result.by_status[verdict.status] += 1
        result.by_dtype[recipe.dtype] += 1
        result.by_regime[recipe.regime] += 1
        if math.isfinite(verdict.max_ratio):
            prev = result.max_ratio_by_dtype.get(recipe.dtype, 0.0)
            result.max_ratio_by_dtype[recipe.dtype] = max(prev, verdict.max_ratio)
            target(min(verdict.max_ratio, 1e6), label="error/budget")
        event(f"regime {recipe.regime}")
        event(f"dtype {recipe.dtype}")
        if progress is not None:
            progress(result)
        if verdict.status == BUG:
            kinds = "+".join(sorted({f.kind for f in verdict.findings}))
            if kinds not in first_saved:  # the case as first found, before shrinking
                first_saved.add(kinds)
                path = save_finding(corpus, verdict, case, label="found")
                result.findings.append(_finding_entry(verdict, path, shrunk=False))
            raise _FoundBug(verdict, case)

    test = settings(
        max_examples=max_examples, deadline=None, database=DirectoryBasedExampleDatabase(
            str(database or corpus / ".hypothesis")),
        suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, report_multiple_bugs=False,
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    )(given(recipe=strategy)(body))
    if seed is not None:
        test = hypothesis_seed(seed)(test)

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum, frame):
        stop_reason[:1] = ["interrupted"]
        raise KeyboardInterrupt

    in_main_thread = threading.current_thread() is threading.main_thread()
    if in_main_thread:  # signal handlers can only be set there
        signal.signal(signal.SIGTERM, on_term)
    try:
        test()
    except _FoundBug as found:
        path = save_finding(corpus, found.verdict, found.case, label="shrunk")
        result.findings.append(_finding_entry(found.verdict, path, shrunk=True))
        result.stopped = "bug_found"
    except _Stop:
        result.stopped = stop_reason[0] if stop_reason else "time_budget"
    except KeyboardInterrupt:
        result.stopped = "interrupted"
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    result.elapsed = time.monotonic() - start
    statuses = [f["status"] for f in result.findings] + list(result.by_status)
    result.verdict = worst_status(s for s in statuses if s in (PASS, SUSPICIOUS, BUG))
    return result


def _finding_entry(verdict: Verdict, path: Path, *, shrunk: bool) -> dict:
    return {
        "status": verdict.status,
        "kinds": sorted({f.kind for f in verdict.findings}),
        "diagnosis": [f.diagnosis for f in verdict.findings],
        "max_ratio": json_number(verdict.max_ratio),
        "case": verdict.case,
        "regime": verdict.regime,
        "shrunk": shrunk,
        "path": str(path),
        "replay": f"flashcheck replay {path}",
    }


def write_summary(result: CampaignResult, path: str | Path) -> None:
    """Write the JSON summary atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(result.as_dict(), indent=2, default=str))
    os.replace(tmp, path)
