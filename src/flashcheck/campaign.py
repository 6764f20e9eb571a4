"""Fuzzing campaigns: hypothesis draws recipes, flashcheck checks each case, findings are saved at once.

A campaign runs a kernel over cases drawn from a preset's regimes, shrinks the first failing case to a
small one, and writes every finding to the corpus directory the moment it is found (first the case as
found, then the shrunk one), so an interrupted campaign loses nothing. The summary is JSON with the
verdict, counts per regime and dtype, throughput and one entry per finding with its replay command.

A kernel given by name runs in a worker process (:mod:`flashcheck.worker`): a kernel that kills its
process, hangs past the case timeout or poisons its CUDA context is a finding, and the campaign goes on
with a fresh worker. A case too big for the device's memory is skipped and counted, not a finding.

With ``keep_going`` the campaign does not stop at the first bug: each distinct bug (its signature is
the sorted finding kinds, e.g. ``crash`` or ``over_budget``) is shrunk and saved once, later cases with
a known signature are only counted, and the campaign ends at ``max_examples`` or the time budget.
Hypothesis stops at the first failure, so each bug ends a round and the next round draws the remaining
examples with fresh randomness (derived from the seed, so a seed still fixes every case).
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, Phase, Verbosity, event, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from .case import AttentionCase
from .check import check
from .errors import InvalidArgument
from .kernels import resolve_kernel
from .diagnose import growth_with_length
from .presets import Preset
from .properties import PROPERTIES, PROPERTY_EVERY, properties_for
from .spec import Kernel, as_kernel
from .strategies import Recipe, recipes
from .verdict import BUG, PASS, SUSPICIOUS, Verdict, json_number, worst_status, write_json
from .worker import KernelWorker, WorkerStartError

__all__ = ["CampaignResult", "run_campaign", "save_finding", "signature"]


class _FoundBug(Exception):
    def __init__(self, verdict: Verdict, case: AttentionCase):
        super().__init__(verdict.status)
        self.verdict = verdict
        self.case = case


def _fail(failure: tuple):
    # One place that raises: hypothesis tells failures apart by where they were raised, and a failure
    # replayed from memory must look like the one the kernel produced.
    raise _FoundBug(*failure)


class _Stop(Exception):
    """The time budget ran out or the user interrupted: end the campaign, keep what was found."""


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
    # generation (hypothesis and the regimes), kernel (the first call), oracle (reference and budget),
    # properties (the exact properties' reruns), envelope (the twin's tilings, for SUSPICIOUS).
    time_split: dict = field(default_factory=lambda: dict.fromkeys(
        ("generation", "kernel", "oracle", "properties", "envelope"), 0.0))
    by_status: Counter = field(default_factory=Counter)
    by_dtype: Counter = field(default_factory=Counter)
    by_regime: Counter = field(default_factory=Counter)
    max_ratio_by_dtype: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)
    stopped: str = "max_examples"
    isolation: str = "in-process"
    case_timeout: float | None = None
    keep_going: bool = False
    skipped: Counter = field(default_factory=lambda: Counter(oom=0))
    timeouts: int = 0
    worker_restarts: int = 0
    bug_signatures: Counter = field(default_factory=Counter)  # generated cases per bug signature
    # Information, not findings: e.g. cases whose last sequence gave other bits alone than in its batch.
    info: Counter = field(default_factory=lambda: Counter(batch_dependent=0, batch_checked=0))
    ratios_by_signature: dict = field(default_factory=dict)  # signature -> [(Nk, err/budget)] of drawn cases
    case_log: list = field(default_factory=list)  # every case run, in order: the same seed gives the same log
    notes: list = field(default_factory=list)

    def as_dict(self) -> dict:
        log_hash = hashlib.sha256("\n".join(self.case_log).encode()).hexdigest()
        return {
            "verdict": self.verdict, "kernel": self.kernel, "device": self.device, "preset": self.preset,
            "seed": self.seed, "cases": self.cases, "examples": self.examples, "elapsed_s": round(self.elapsed, 3),
            "cases_per_s": round(self.cases / self.elapsed, 3) if self.elapsed > 0 else None,
            "time_split_s": {k: round(v, 3) for k, v in self.time_split.items()},
            "counts": {"by_status": dict(self.by_status), "by_dtype": dict(self.by_dtype),
                       "by_regime": dict(self.by_regime)},
            "max_ratio_by_dtype": {k: json_number(v) for k, v in self.max_ratio_by_dtype.items()}, "stopped": self.stopped,
            "properties": {"checked": list(PROPERTIES), "every_nth_case": PROPERTY_EVERY},
            "isolation": self.isolation, "case_timeout_s": self.case_timeout, "keep_going": self.keep_going,
            "skipped": dict(self.skipped), "timeouts": self.timeouts, "worker_restarts": self.worker_restarts,
            "bug_signatures": dict(self.bug_signatures), "notes": self.notes, "info": dict(self.info),
            "findings": self.findings,
            "case_log_sha256": log_hash, "case_log": self.case_log,
        }


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")[:60]


def signature(verdict: Verdict) -> str:
    """What tells one bug from another in a campaign: the sorted kinds of its findings (``crash``,
    ``over_budget+poison_leak``, ...)."""
    return "+".join(sorted({f.kind for f in verdict.findings})) or verdict.status.lower()


def save_finding(corpus: Path, verdict: Verdict, case: AttentionCase, *, label: str) -> Path:
    """Save a failing case under ``corpus`` with its verdict; returns the JSON path."""
    kinds = signature(verdict)
    digest = hashlib.sha1(json.dumps(case.provenance.get("recipe", case.describe()), sort_keys=True,
                                     default=str).encode()).hexdigest()[:10]
    stem = corpus / f"{_slug(verdict.kernel)}-{kinds}-{label}-{digest}"
    provenance = dict(case.provenance)
    provenance["verdict"] = verdict.as_dict()
    saved = AttentionCase.create(case.q, case.k, case.v, scale=case.scale, causal=case.causal,
                                 attn_mask=case.attn_mask, layout=case.layout, provenance=provenance)
    _, json_path = saved.save(stem)
    return json_path


class _Round:
    """What the test body knows about one hypothesis run of the campaign."""

    def __init__(self):
        self.signature: str | None = None  # the bug being shrunk; None while hypothesis still generates
        self.generated = 0                 # cases generated (not shrink candidates): they count to max_examples
        self.partial = False               # the shrink was cut short (time budget, a worker that failed)
        self.failures: dict = {}           # recipe -> (verdict, case) of failures of that signature
        self.first: tuple | None = None    # the failure that started the shrink (saved as found)
        self.best: tuple | None = None     # the latest such failure: the smallest so far


def _round_seed(seed: int | None, round_no: int) -> int | None:
    # Round 0 keeps the seed as given; later rounds derive theirs, so one seed still fixes every case.
    if seed is None or round_no == 0:
        return seed
    return int(hashlib.sha256(f"{seed}/{round_no}".encode()).hexdigest()[:16], 16)


def run_campaign(kernel: str | Kernel, *, device: str, preset: Preset, dtypes=None, max_examples: int | None = None,
                 time_budget: float | None = None, seed: int | None = None, corpus: str | Path = "flashcheck-corpus",
                 database: str | Path | None = None, progress=None, keep_going: bool = False, isolate: bool = True,
                 case_timeout: float | None = None, kernel_options: dict | None = None) -> CampaignResult:
    """Run one campaign; never raises for what the kernel does (that is a finding).

    ``kernel`` given by name (a built-in or ``package.module:function``; ``kernel_options`` for a
    built-in) runs in a worker process, restarted whenever it dies or hangs, unless ``isolate=False``;
    a :class:`Kernel` or a callable runs in this process. ``case_timeout`` bounds one case in the worker
    (default 300 s on a GPU, 600 s on the CPU). ``keep_going`` goes on past the first bug.
    """
    corpus = Path(corpus)
    max_examples = max_examples or preset.max_examples
    time_budget = time_budget if time_budget is not None else preset.time_budget
    if isinstance(kernel, str):
        resolved = resolve_kernel(kernel, device=device, **(kernel_options or {}))
    else:
        if kernel_options:
            raise InvalidArgument("kernel_options", kernel_options, "options are for a kernel given by name",
                                  "Pass the kernel's name, or bind the options in the kernel itself.")
        resolved, isolate = as_kernel(kernel), False  # an object cannot be resolved again in another process
    if case_timeout is not None and not isolate:
        raise InvalidArgument("case_timeout", case_timeout, "only a worker process can be stopped when a case "
                              "hangs, and this kernel runs in-process",
                              "Pass the kernel by name with isolate=True (CLI: drop --no-isolation), or drop "
                              "the timeout.")
    if dtypes is None:
        dtypes = preset.dtypes
    dtypes = [d for d in dtypes if d in resolved.spec.dtypes]
    if not dtypes:
        raise InvalidArgument("dtype", list(dtypes), f"kernel {resolved.name} supports only {resolved.spec.dtypes}",
                              "Pick a dtype the kernel supports.")
    strategy = recipes(spec=resolved.spec, dtypes=dtypes, **preset.strategy_options())
    corpus.mkdir(parents=True, exist_ok=True)
    stop_reason: list[str] = []
    worker = None
    if isolate:
        worker = KernelWorker(kernel, device=device, options=kernel_options, case_timeout=case_timeout,
                              should_stop=lambda: stop_reason == ["interrupted"])
    result = CampaignResult(verdict=PASS, kernel=resolved.name, device=str(device), preset=preset.name, seed=seed,
                            isolation="worker" if worker else "in-process", keep_going=keep_going,
                            case_timeout=worker.case_timeout if worker else None)
    clock = {"start": time.monotonic(), "deadline": math.inf}
    saved_found: set[str] = set()     # signatures whose first case is saved
    shrunk: set[str] = set()          # signatures shrunk and saved: later cases are only counted
    in_kernel = [False]               # a case runs in this process: only an exception can stop it
    last_end = [time.monotonic()]
    current = [_Round()]

    def save(verdict: Verdict, case: AttentionCase, *, label: str, **extra) -> None:
        path = save_finding(corpus, verdict, case, label=label)
        result.findings.append({**_finding_entry(verdict, path, shrunk=label == "shrunk"), **extra})
        if stop_reason == ["interrupted"]:
            raise KeyboardInterrupt

    def judge(case: AttentionCase, recipe: Recipe) -> Verdict:
        properties = properties_for(recipe.seed)
        if worker is not None:
            return worker.check(case, properties=properties)
        in_kernel[0] = True
        try:
            return check(resolved, case, device=device, properties=properties)
        finally:
            in_kernel[0] = False

    def body(recipe: Recipe):
        rnd = current[0]
        shrinking = rnd.signature is not None
        if stop_reason == ["interrupted"]:
            raise KeyboardInterrupt
        if stop_reason or time.monotonic() > clock["deadline"]:
            stop_reason[:1] = stop_reason or ["time_budget"]
            if not shrinking:
                raise _Stop()
            # Out of time while shrinking: failures replay from memory and anything else passes, so that
            # hypothesis ends the shrink at once with the smallest failing case so far.
            rnd.partial = True
            if recipe in rnd.failures:
                _fail(rnd.failures[recipe])
            return
        if recipe in rnd.failures:  # hypothesis's final replay: the kernel need not run (or die) again
            _fail(rnd.failures[recipe])
        t0 = time.monotonic()
        case = recipe.build(kernel=resolved.name)
        result.time_split["generation"] += time.monotonic() - t0 + (t0 - last_end[0])
        try:
            verdict = judge(case, recipe)
        except WorkerStartError as exc:  # it loaded before: the machine, not the kernel, is failing now
            result.notes.append(f"stopped: a fresh worker process could not start: {exc}")
            stop_reason[:1] = ["worker_failed"]
            if shrinking:
                rnd.partial = True
                return
            raise _Stop() from None
        for part in ("kernel", "oracle", "properties", "envelope"):
            result.time_split[part] += verdict.elapsed.get(part, 0.0)
        last_end[0] = time.monotonic()
        result.cases += 1
        result.case_log.append(f"{case.describe()} regime={recipe.regime} seed={recipe.seed}")
        result.by_dtype[recipe.dtype] += 1
        result.by_regime[recipe.regime] += 1
        if worker is not None:
            result.worker_restarts = worker.restarts
        if not shrinking:
            rnd.generated += 1
            result.examples += 1
        if verdict.skipped:  # e.g. out of memory: not the kernel's fault, and no verdict on it
            result.skipped[verdict.skipped.split(":")[0]] += 1
            if progress is not None:
                progress(result)
            return
        result.by_status[verdict.status] += 1
        if not shrinking and "batch" in verdict.properties:
            result.info["batch_checked"] += 1
            result.info["batch_dependent"] += any(n.startswith("batch-dependent") for n in verdict.notes)
        result.timeouts += any(f.kind == "timeout" for f in verdict.findings)
        if math.isfinite(verdict.max_ratio):
            prev = result.max_ratio_by_dtype.get(recipe.dtype, 0.0)
            result.max_ratio_by_dtype[recipe.dtype] = max(prev, verdict.max_ratio)
            target(min(verdict.max_ratio, 1e6), label="error/budget")
        event(f"regime {recipe.regime}")
        event(f"dtype {recipe.dtype}")
        if progress is not None:
            progress(result)
        if verdict.status == BUG:
            sig = signature(verdict)
            if not shrinking:
                result.bug_signatures[sig] += 1
                if math.isfinite(verdict.max_ratio):
                    result.ratios_by_signature.setdefault(sig, []).append((case.shapes.n_k, verdict.max_ratio))
            if sig not in saved_found:  # the case as first found, before shrinking
                saved_found.add(sig)
                save(verdict, case, label="found", examples_at=result.examples)  # drawn cases so far
            if sig in shrunk or (shrinking and sig != rnd.signature):
                return  # a bug already shrunk, or not the one this round shrinks: saved and counted, no failure
            failure = (verdict, case)
            if not shrinking:
                rnd.signature, rnd.first = sig, failure
            rnd.failures[recipe] = rnd.best = failure
            _fail(failure)

    def make_test(round_no: int, examples: int):
        # Later rounds skip the database: it holds the failures just shrunk, which would only count again.
        phases = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink) if round_no == 0 \
            else (Phase.generate, Phase.target, Phase.shrink)
        test = settings(
            max_examples=examples, deadline=None, database=DirectoryBasedExampleDatabase(
                str(database or corpus / ".hypothesis")),
            suppress_health_check=list(HealthCheck), verbosity=Verbosity.quiet, report_multiple_bugs=False,
            phases=phases,
        )(given(recipe=strategy)(body))
        round_seed = _round_seed(seed, round_no)
        return hypothesis_seed(round_seed)(test) if round_seed is not None else test

    def record_shrunk(verdict: Verdict, case: AttentionCase, *, complete: bool) -> None:
        shrunk.add(signature(verdict))
        save(verdict, case, label="shrunk", shrink_complete=complete)

    def on_signal(signum, frame):
        # Only a flag, read at safe points (the next case, the worker's wait, after a save): an exception
        # raised anywhere could land in a half-written case or in a callback that swallows it. A kernel
        # running in this process can only be stopped by one, though.
        stop_reason[:1] = ["interrupted"]
        if in_kernel[0]:
            raise KeyboardInterrupt

    handled = (signal.SIGTERM, signal.SIGINT)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in handled} if in_main_thread else {}
    for s in previous:  # signal handlers can only be set in the main thread
        signal.signal(s, on_signal)
    generated = 0
    round_no = 0
    try:
        if worker is not None:
            worker.start()  # a kernel that cannot load in the worker is a usage error, before any case runs
        # The clock starts once the kernel is loaded, as it did when the kernel loaded in this process.
        clock["start"] = last_end[0] = time.monotonic()
        clock["deadline"] = clock["start"] + time_budget if time_budget else math.inf
        while True:
            remaining = max_examples - generated
            if remaining <= 0:
                result.stopped = "max_examples"
                break
            rnd = current[0] = _Round()
            finished = False
            try:
                make_test(round_no, remaining)()
                finished = True
            except _FoundBug as found:
                record_shrunk(found.verdict, found.case, complete=not rnd.partial)
            except Flaky:
                # hypothesis could not reproduce the failure: keep the smallest case that did fail
                result.notes.append(f"a {rnd.signature} failure did not reproduce on replay (a flaky kernel)")
                if rnd.best is not None:
                    record_shrunk(*rnd.best, complete=False)
            finally:
                generated += rnd.generated
            if finished:
                result.stopped = "max_examples"
                break
            if not keep_going:
                result.stopped = "bug_found"
                break
            if stop_reason:
                result.stopped = stop_reason[0]
                break
            round_no += 1
    except _Stop:
        result.stopped = stop_reason[0] if stop_reason else "time_budget"
    except KeyboardInterrupt:
        result.stopped = "interrupted"
        rnd = current[0]
        if rnd.best is not None and rnd.best is not rnd.first and rnd.signature not in shrunk:
            try:  # keep the shrink's progress: the smallest failing case so far
                record_shrunk(*rnd.best, complete=False)
            except KeyboardInterrupt:
                pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if worker is not None:
            worker.close()
            result.worker_restarts = worker.restarts
    result.elapsed = time.monotonic() - clock["start"]
    for entry in result.findings:  # a defect that accumulates along the keys says so
        growth = growth_with_length(result.ratios_by_signature.get("+".join(entry["kinds"]), []))
        if growth:
            entry["diagnosis"] = list(entry["diagnosis"]) + [growth]
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
    write_json(path, result.as_dict())
