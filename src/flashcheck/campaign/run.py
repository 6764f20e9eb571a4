"""Fuzzing campaigns: hypothesis draws recipes, flashcheck checks each case, findings are saved at once.

A campaign runs a kernel over cases drawn from a preset's regimes, shrinks the first failing case to a
small one, and writes every finding to the corpus directory the moment it is found (first the case as
found, then the shrunk one), so an interrupted campaign loses nothing. The summary is JSON with the
verdict, counts per regime and dtype, throughput and one entry per finding with its replay command.

A kernel given by name runs in a worker process (:mod:`flashcheck.campaign.worker`): a kernel that kills its
process, hangs past the case timeout or poisons its CUDA context is a finding, and the campaign goes on
with a fresh worker. A case too big for the device's memory, or one the kernel refuses with
:class:`flashcheck.Unsupported`, is skipped and counted (by kind and by reason), not a finding; a campaign
that judged no case at all says ``NO_CASES``, never PASS.

Failing cases are grouped into distinct bugs by root cause (:mod:`flashcheck.campaign.causes`): a case that fails
in a non-contiguous layout is first rerun contiguous, and if that passes its cause is the layout. With
``keep_going`` the campaign does not stop at the first bug: each distinct bug is shrunk and saved once,
later cases with a known cause are only counted (by regime, dtype, layout and causal alignment), and the
campaign ends at ``max_examples`` or the time budget. A SUSPICIOUS case is saved once per cause, not
shrunk. The summary leads with the distinct bugs (:mod:`flashcheck.campaign.bugs`); the raw findings follow.
Hypothesis stops at the first failure, so each bug ends a round and the next round draws the remaining
examples with fresh randomness (derived from the seed, so a seed still fixes every case). Over several
dtypes, each dtype draws its share of the cases and of the time in an engine of its own, one after the
other, with the example database's keys apart; the failures stored for every dtype replay first.

The summary's ``first_case_s`` is the time a user waits for the first result: seconds from ``started_at``
(``flashcheck fuzz``: the start of its process, :func:`flashcheck.campaign.clock.process_start`; by default the
call of :func:`run_campaign`) to the end of the first judged case (None while no case was judged). A
worker process started before this one imported torch (``worker_process``) loads the kernel meanwhile.
"""

from __future__ import annotations

import hashlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from hypothesis import Phase, event, target

from ..contract.spec import Kernel, as_kernel
from ..errors import InvalidArgument
from ..inputs.case import AttentionCase
from ..inputs.layout import Layout
from ..inputs.presets import Preset
from ..inputs.strategies import Recipe, recipes
from ..judge.backward import drawn_backward_case, judge_case
from ..judge.diagnose import growth_with_length
from ..judge.properties import properties_for
from ..judge.verdict import BUG, PASS, SUSPICIOUS, Verdict, run_verdict
from ..kernels.registry import dtype_left_out, resolve_kernel
from ..numerics.oracle import reference_attention
from .causes import Cause, needs_layout_triage, root_cause
from .corpus import save_finding
from .database import KeyedDatabase, open_database
from .engine import Shrink, hypothesis_test, run_test
from .interrupts import take_pending
from .result import TIMED_PARTS, TRIAGE, CampaignResult, count_skip_reasons, finding_entry, record_row
from .worker import KernelWorker, WorkerProcess, WorkerStartError

__all__ = ["prepare_campaign", "run_campaign"]

class _Stop(Exception):
    """The time budget ran out or the user interrupted: end the campaign, keep what was found."""


@dataclass
class _Round(Shrink):
    """What the test body knows about one hypothesis run of the campaign; its failures are
    ``(verdict, case, cause)`` of the one cause it shrinks."""

    signature: str | None = None  # the cause of the bug being shrunk; None while hypothesis generates
    generated: int = 0            # cases generated (not shrink candidates): they count to max_examples


def _round_seed(seed: int | None, round_no: int) -> int | None:
    # Round 0 keeps the seed as given; later rounds derive theirs, so one seed still fixes every case.
    if seed is None or round_no == 0:
        return seed
    return int(hashlib.sha256(f"{seed}/{round_no}".encode()).hexdigest()[:16], 16)


def prepare_campaign(kernel: str | Kernel, *, device: str, preset: Preset, dtypes=None, isolate: bool = True,
                     case_timeout: float | None = None, kernel_options: dict | None = None,
                     backward: bool = False) -> tuple:
    """Resolve the kernel and check the options: ``(kernel, isolate, dtypes)``, or :class:`InvalidArgument`."""
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
    if backward and not resolved.spec.backward:
        raise InvalidArgument("backward", backward, f"kernel {resolved.name} declares no backward pass",
                              "Declare backward=True in its spec if autograd can differentiate it, or drop "
                              "--backward (the forward pass is checked).")
    wanted = list(preset.dtypes if dtypes is None else dtypes)
    dtypes = [d for d in wanted if d in resolved.spec.dtypes]
    if not dtypes:
        raise _no_dtype(resolved, device, wanted)
    return resolved, isolate, dtypes


def _no_dtype(resolved: Kernel, device: str, wanted: list) -> InvalidArgument:
    problem, fix = f"kernel {resolved.name} supports only {resolved.spec.dtypes}", "Pick a dtype the kernel supports."
    why = [(d, reason) for d in wanted if (reason := dtype_left_out(resolved, device, d))]
    if why:  # a built-in that has the dtype, but not on this device
        problem += f" on {device}: {why[0][1]}"
        fix = f"Check {why[0][0]} with --device cuda, or pick one of {resolved.spec.dtypes}."
    return InvalidArgument("dtype", wanted, problem, fix)


def warm_oracle(device) -> None:
    """On a GPU, run the oracle once on a tiny input in a background thread: the CUDA context, the
    cuBLAS handle and the float64 kernels load while the campaign is prepared and the first case drawn
    and run (torch releases the GIL inside its operations), not inside the first case's oracle."""
    if torch.device(device).type != "cuda":
        return

    def warm():
        try:
            q = torch.ones((1, 1, 4, 8), dtype=torch.float16, device=device)
            reference_attention(q, q, q, scale=1.0)
        except Exception:  # noqa: BLE001 - a broken device shows itself in the first case, with its error
            pass

    threading.Thread(target=warm, name="flashcheck-warm-oracle", daemon=True).start()


def run_campaign(kernel: str | Kernel, *, device: str, preset: Preset, dtypes=None, max_examples: int | None = None,
                 time_budget: float | None = None, seed: int | None = None, corpus: str | Path = "flashcheck-corpus",
                 database: str | Path | None = None, progress=None, keep_going: bool = False, isolate: bool = True,
                 case_timeout: float | None = None, kernel_options: dict | None = None, on_finding=None,
                 reuse: bool = True, worker_process: WorkerProcess | None = None,
                 started_at: float | None = None, backward: bool = False, records: bool = False) -> CampaignResult:
    """Run one campaign; never raises for what the kernel does (that is a finding).

    ``kernel`` given by name (a built-in or ``package.module:function``; ``kernel_options`` for a
    built-in) runs in a worker process, restarted whenever it dies or hangs, unless ``isolate=False``;
    a :class:`Kernel` or a callable runs in this process. ``case_timeout`` bounds one case in the worker
    (default 300 s on a GPU, 600 s on the CPU). ``keep_going`` goes on past the first bug.
    ``progress(result)`` is called after each case, ``on_finding(entry)`` with each finding's summary
    entry as soon as its case is saved. ``reuse=False`` leaves out hypothesis's replay of the example
    database (it is still written), so that the seed alone fixes the cases (:mod:`flashcheck.campaign.parallel`).

    ``worker_process``, a :class:`flashcheck.campaign.worker.WorkerProcess` started before this process imported
    torch, becomes the kernel's worker: it is told the kernel's name at once and loads it while the
    campaign is prepared here; it is closed when this returns or raises, used or not (a kernel object
    runs in-process). ``started_at`` (a ``time.monotonic()`` value, default: now) is what the summary's
    ``first_case_s`` counts from. ``records`` keeps one row per drawn, judged case (``RECORD_COLUMNS``).
    """
    started_at = time.monotonic() if started_at is None else started_at
    corpus = Path(corpus)
    try:
        if worker_process is not None and isolate and isinstance(kernel, str):  # it loads the kernel meanwhile
            worker_process.assign(kernel, device=device, options=kernel_options)
        warm_oracle(device)
        resolved, isolate, dtypes = prepare_campaign(kernel, device=device, preset=preset, dtypes=dtypes,
                                                     isolate=isolate, case_timeout=case_timeout,
                                                     kernel_options=kernel_options, backward=backward)
        spec = resolved.spec.for_backward() if backward else resolved.spec
        strategies = {d: recipes(spec=spec, dtypes=[d], **preset.strategy_options()) for d in dtypes}
        corpus.mkdir(parents=True, exist_ok=True)
        example_db = open_database(database, default_dir=corpus / ".hypothesis")  # a bad --database fails here
        worker_args = dict(target=kernel, device=device, options=kernel_options, case_timeout=case_timeout,
                           process=worker_process) if isolate else None
        campaign = _Campaign(resolved, strategies, device=device, preset=preset, seed=seed, corpus=corpus,
                             database=example_db, worker_args=worker_args, keep_going=keep_going, progress=progress,
                             on_finding=on_finding, reuse=reuse, started_at=started_at, backward=backward)
        if records:
            campaign.result.records = []
        return campaign.run(max_examples=max_examples or preset.max_examples,
                            time_budget=time_budget if time_budget is not None else preset.time_budget)
    finally:
        if worker_process is not None:
            worker_process.close()  # nothing to do once the campaign's worker took it over


class _Campaign:
    """One campaign's state, shared by hypothesis's test body (:meth:`body`) and the loop over its rounds."""

    def __init__(self, resolved: Kernel, strategies: dict, *, device: str, preset: Preset, seed: int | None, corpus: Path,
                 database, worker_args: dict | None, keep_going: bool, progress, on_finding, reuse: bool,
                 started_at: float, backward: bool = False):
        self.resolved, self.strategies, self.device, self.seed = resolved, strategies, device, seed  # dtype ->
        self.started_at = started_at
        self.backward = backward  # each case checks the backward pass, with a dO regime from its seed
        self.corpus, self.database, self.reuse = corpus, database, reuse
        self.keep_going, self.progress, self.on_finding = keep_going, progress, on_finding
        self.worker = KernelWorker(**worker_args, should_stop=self.interrupted) if worker_args is not None else None
        self.result = CampaignResult(verdict=PASS, kernel=resolved.name, device=str(device), preset=preset.name,
                                     seed=seed, isolation="worker" if self.worker else "in-process",
                                     keep_going=keep_going, backward=backward,
                                     case_timeout=self.worker.case_timeout if self.worker else None)
        self.stop_reason: str | None = None  # "interrupted", "time_budget" or "worker_failed"
        self.in_kernel = False               # a case runs in this process: only an exception can stop it
        self.start = self.last_end = time.monotonic()
        self.first_case_at: float | None = None
        self.deadline = self.campaign_deadline = math.inf  # the current dtype's, the campaign's
        self.round = _Round()
        self.round_no = 0
        self.generated = 0                   # cases drawn (not shrink candidates): they count to max_examples
        self.saved_found: set[str] = set()   # causes whose first case is saved
        self.shrunk: set[str] = set()        # causes shrunk and saved: later cases are only counted

    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    # ---- hypothesis's test body ---------------------------------------------------------------------

    def body(self, recipe: Recipe) -> None:
        rnd = self.round
        shrinking = rnd.signature is not None
        if self.interrupted():
            raise KeyboardInterrupt
        if self.stop_reason or time.monotonic() > self.deadline:
            self._out_of_time(recipe, shrinking)
            return
        rnd.raise_known(recipe)  # hypothesis's final replay: the kernel need not run (or die) again
        ran = self._run_case(recipe, shrinking)
        if ran is None:
            return
        if self.interrupted():
            # The signal reached the kernel's process group too (Ctrl-C, timeout -s INT): a compiler or a
            # kernel killed by it is not the kernel's failure, so a case in flight is not judged.
            raise KeyboardInterrupt
        verdict, case = ran
        if not self._count(verdict, case, recipe, shrinking):
            return
        cause = self.cause(verdict, case, recipe) if verdict.status in (BUG, SUSPICIOUS) else None
        if self.result.records is not None and not shrinking:
            self.result.records.append(record_row(recipe, verdict, cause))
        if verdict.status == BUG:
            self._on_bug(verdict, case, recipe, shrinking, cause)
        elif cause is not None and not shrinking:
            self._on_suspicious(verdict, case, recipe, cause)

    def _out_of_time(self, recipe: Recipe, shrinking: bool) -> None:
        self.stop_reason = self.stop_reason or "time_budget"
        if not shrinking:
            raise _Stop()
        # Out of time while shrinking: failures replay from memory and anything else passes, so that
        # hypothesis ends the shrink at once with the smallest failing case so far.
        self.round.out_of_time(recipe)

    def _run_case(self, recipe: Recipe, shrinking: bool) -> tuple | None:
        """``(verdict, case)``, or None when no worker could start while shrinking (the shrink ends)."""
        t0 = time.monotonic()
        case = recipe.build(kernel=self.resolved.name)
        if self.backward:
            case = drawn_backward_case(case, recipe.seed)
        self.result.time_split["generation"] += time.monotonic() - t0 + (t0 - self.last_end)
        try:
            return self.judge(case, recipe), case
        except WorkerStartError as exc:  # it loaded before: the machine, not the kernel, is failing now
            self.result.notes.append(f"stopped: a fresh worker process could not start: {exc}")
            self.stop_reason = "worker_failed"
            if shrinking:
                self.round.cut = True
                return None
            raise _Stop() from None

    def judge(self, case: AttentionCase, recipe: Recipe, *, triage: bool = False) -> Verdict:
        properties = () if self.backward else properties_for(recipe.seed)
        if triage:  # the rerun that names a cause tests the case's own layout, not the others
            properties = tuple(p for p in properties if p != "layout")
        if self.worker is not None:
            return self.worker.check(case, properties=properties)
        self.in_kernel = True
        try:
            return judge_case(self.resolved, case, device=self.device, properties=properties)
        finally:
            self.in_kernel = False

    def cause(self, verdict: Verdict, case: AttentionCase, recipe: Recipe) -> Cause:
        """The root cause of a failing case; one that fails in a non-contiguous layout first runs contiguous."""
        contiguous = None
        if needs_layout_triage(verdict, case.layout.name) and not self.interrupted():
            t0 = time.monotonic()
            try:
                contiguous = self.judge(case.with_layout(Layout.contiguous()), recipe, triage=True)
            except (WorkerStartError, KeyboardInterrupt):
                contiguous = None  # no verdict: the findings alone name the cause; the case is saved next
            if self.interrupted():
                contiguous = None  # a rerun cut short by the stop says nothing
            self.result.time_split[TRIAGE] += time.monotonic() - t0
            self.last_end = time.monotonic()
        return root_cause(verdict, layout_name=case.layout.name, contiguous=contiguous)

    def _count(self, verdict: Verdict, case: AttentionCase, recipe: Recipe, shrinking: bool) -> bool:
        """Count the case in the result; whether it was judged (not skipped)."""
        r = self.result
        for part in TIMED_PARTS:
            r.time_split[part] += verdict.elapsed.get(part, 0.0)
        r.compilations += getattr(verdict, "compilations", 0)
        self.last_end = time.monotonic()
        r.cases += 1
        r.case_log.append(f"{case.describe()} regime={recipe.regime} seed={recipe.seed}")
        r.by_dtype[recipe.dtype] += 1
        r.by_regime[recipe.regime] += 1
        if self.worker is not None:
            r.worker_restarts = self.worker.restarts
        if not shrinking:
            self.round.generated += 1
            r.examples += 1
        if verdict.skipped:  # out of memory, unsupported: not the kernel's fault, and no verdict on it
            r.skipped[verdict.skipped.split(":")[0]] += 1
            count_skip_reasons(r.skipped_reasons, {verdict.skipped: 1})
        else:
            if r.first_case is None:
                r.first_case = self.last_end - self.started_at
                self.first_case_at = self.last_end
            self._count_judged(verdict, recipe, shrinking)
        if self.progress is not None:
            self.progress(r)
        return not verdict.skipped

    def _count_judged(self, verdict: Verdict, recipe: Recipe, shrinking: bool) -> None:
        r = self.result
        r.by_status[verdict.status] += 1
        if not shrinking and "batch" in verdict.properties:
            r.info["batch_checked"] += 1
            r.info["batch_dependent"] += any(n.startswith("batch-dependent") for n in verdict.notes)
        r.timeouts += any(f.kind == "timeout" for f in verdict.findings)
        if math.isfinite(verdict.max_ratio):
            r.max_ratio_by_dtype[recipe.dtype] = max(r.max_ratio_by_dtype.get(recipe.dtype, 0.0), verdict.max_ratio)
            target(min(verdict.max_ratio, 1e6), label="error/budget")
        event(f"regime {recipe.regime}")
        event(f"dtype {recipe.dtype}")

    def _on_suspicious(self, verdict: Verdict, case: AttentionCase, recipe: Recipe, cause: Cause) -> None:
        r = self.result
        r.bug_signatures[cause.key] += 1
        r.bugs.count(cause, verdict, recipe)
        if cause.key not in self.saved_found:  # saved once, not shrunk: it passes the hard budget
            self.saved_found.add(cause.key)
            self.save(verdict, case, cause, label="found", examples_at=r.examples)

    def _on_bug(self, verdict: Verdict, case: AttentionCase, recipe: Recipe, shrinking: bool, cause: Cause) -> None:
        rnd, r, sig = self.round, self.result, cause.key
        if not shrinking:
            r.bug_signatures[sig] += 1
        if not shrinking or sig != rnd.signature:  # a shrink's candidates count apart, for other bugs only
            r.bugs.count(cause, verdict, recipe, drawn=not shrinking)
        if sig not in self.saved_found:  # the case as first found, before shrinking
            self.saved_found.add(sig)
            self.save(verdict, case, cause, label="found", examples_at=r.examples)  # drawn cases so far
        if sig in self.shrunk or (shrinking and sig != rnd.signature):
            return  # a bug already shrunk, or not the one this round shrinks: saved and counted, no failure
        if not shrinking:
            rnd.signature = sig
        rnd.fail(recipe, (verdict, case, cause))

    def save(self, verdict: Verdict, case: AttentionCase, cause: Cause, *, label: str, **extra) -> None:
        path = save_finding(self.corpus, verdict, case, label=label, kernel=self.resolved)
        entry = {**finding_entry(verdict, case, path, cause, shrunk=label == "shrunk", device=self.device), **extra}
        self.result.findings.append(entry)
        self.result.bugs.saved(cause, verdict.status, entry)
        if self.on_finding is not None:
            self.on_finding(entry)
        if self.interrupted():
            raise KeyboardInterrupt

    def _record_shrunk(self, verdict: Verdict, case: AttentionCase, cause: Cause, *, complete: bool) -> None:
        self.shrunk.add(cause.key)
        self.save(verdict, case, cause, label="shrunk", shrink_complete=complete)

    # ---- the rounds ------------------------------------------------------------------------------------

    def _make_test(self, strategy, *, examples: int, database, phases: tuple):
        round_seed = _round_seed(self.seed, self.round_no)
        self.round_no += 1
        return hypothesis_test(self.body, given_args=dict(recipe=strategy), max_examples=examples, seed=round_seed,
                               database=database, phases=phases)

    def _strata(self, max_examples: int) -> str:
        """Each dtype draws its share of the cases, in a hypothesis engine of its own, one dtype after the
        other; returns why the campaign stopped. Hypothesis's free drawing over several dtypes is lumpy
        (25 cases over fp16 and fp32 gave 22 and 3), which starves a sign-off cell of its dtype."""
        strata = [(dtype, strategy, KeyedDatabase(self.database, dtype) if len(self.strategies) > 1 else
                   self.database) for dtype, strategy in self.strategies.items()]
        if self.reuse and len(strata) > 1 and self._replay_stored(strata, max_examples):
            if not self.keep_going or self.stop_reason:
                return self.stop_reason or "bug_found"
        for i, (_, strategy, database) in enumerate(strata):
            left = len(strata) - i
            now = time.monotonic()
            self.deadline = now + (self.campaign_deadline - now) / left  # the time left, shared the same way
            try:
                stopped = self._rounds(strategy, database, math.ceil((max_examples - self.generated) / left),
                                       reuse=self.reuse and len(strata) == 1)
            except _Stop:
                stopped = self.stop_reason or "time_budget"
            if stopped == "time_budget" and left > 1 and time.monotonic() < self.campaign_deadline:
                self.stop_reason = None  # this dtype's share of the time is spent (maybe while shrinking)
                continue
            if stopped != "max_examples":
                return stopped
        return "max_examples"

    def _replay_stored(self, strata: list, max_examples: int) -> bool:
        """Replay every dtype's stored failures before any dtype draws a case; True when one failed. (The
        passing cases hypothesis keeps for its target phase are not replayed in a campaign over dtypes.)"""
        found = False
        for dtype, strategy, _ in strata:
            test = self._make_test(strategy, examples=max_examples,
                                   database=KeyedDatabase(self.database, dtype, failures_only=True),
                                   phases=(Phase.explicit, Phase.reuse, Phase.shrink))
            if self._run_round(test):
                found = True
                if not self.keep_going or self.stop_reason:
                    break
        self.round_no = 0  # the first dtype's first round keeps the seed as given
        return found

    def _rounds(self, strategy, database, examples: int, *, reuse: bool) -> str:
        """Run hypothesis once per bug (once in all without keep_going) until ``examples`` more cases are
        drawn; returns why it stopped."""
        end = self.generated + examples
        # Later rounds skip the database: it holds the failures just shrunk, which would only count again,
        # and with one hypothesis keeps a pareto front that draws the later rounds back to them.
        phases = (Phase.explicit, Phase.reuse) if reuse else ()
        while self.generated < end:
            test = self._make_test(strategy, examples=end - self.generated, database=database,
                                   phases=phases + (Phase.generate, Phase.target, Phase.shrink))
            phases, database = (), None
            if not self._run_round(test):
                return "max_examples"
            if not self.keep_going:
                return "bug_found"
            if self.stop_reason:
                return self.stop_reason
        return "max_examples"

    def _run_round(self, test) -> bool:
        """Run one hypothesis engine; True when it ended on a failure (shrunk and recorded)."""
        rnd = self.round = _Round()
        try:
            outcome = run_test(test, rnd)
        finally:
            self.generated += rnd.generated
        if outcome.flaky and rnd.signature is None and self.stop_reason:
            # hypothesis replayed a case that had passed, after the time ran out: the stop, not a flaky kernel
            raise _Stop()
        if outcome.flaky:  # hypothesis could not reproduce the failure: keep the smallest case that did fail
            self.result.notes.append(f"a {rnd.signature} failure did not reproduce on replay (a flaky kernel)")
        if outcome.failure is None:
            return outcome.flaky
        self._record_shrunk(*outcome.failure, complete=not (rnd.cut or outcome.flaky))
        return True

    def run(self, *, max_examples: int, time_budget: float | None) -> CampaignResult:
        previous = self._install_signal_handlers()
        try:
            if self.worker is not None:
                self.worker.start()  # a kernel that cannot load in the worker is a usage error, before any case
            # The clock starts once the kernel is loaded, as it did when the kernel loaded in this process.
            self.start = self.last_end = time.monotonic()
            self.campaign_deadline = self.start + time_budget if time_budget else math.inf
            self.result.stopped = self._strata(max_examples)
        except _Stop:
            self.result.stopped = self.stop_reason or "time_budget"
        except KeyboardInterrupt:
            self.result.stopped = "interrupted"
            self._keep_shrink_progress()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            if self.worker is not None:
                self.worker.close()
                self.result.worker_restarts = self.worker.restarts
        return self._finish()

    def _keep_shrink_progress(self) -> None:
        rnd = self.round
        if rnd.best is not None and rnd.best is not rnd.first and rnd.signature not in self.shrunk:
            try:  # keep the shrink's progress: the smallest failing case so far
                self._record_shrunk(*rnd.best, complete=False)
            except KeyboardInterrupt:
                pass

    def _finish(self) -> CampaignResult:
        r = self.result
        end = time.monotonic()
        r.elapsed = end - self.start
        if self.first_case_at is not None and r.cases > 1 and end > self.first_case_at:
            r.steady_rate = (r.cases - 1) / (end - self.first_case_at)
        for key, points in r.bugs.lengths.items():  # a defect that accumulates along the keys says so
            growth = growth_with_length(points)
            if growth:
                r.bugs.add_diagnosis(key, growth)
                for entry in r.findings:
                    if entry["cause"] == key:
                        entry["diagnosis"] = list(entry["diagnosis"]) + [growth]
        # PASS needs a judged case: with none (all skipped, or no case at all) the verdict is NO_CASES.
        r.verdict = run_verdict(r.findings, r.by_status)
        return r

    # ---- signals -----------------------------------------------------------------------------------------

    def on_signal(self, signum, frame) -> None:
        # Only a flag, read at safe points (the next case, the worker's wait, after a save): an exception
        # raised anywhere could land in a half-written case or in a callback that swallows it. A kernel
        # running in this process can only be stopped by one, though.
        self.stop_reason = "interrupted"
        if self.in_kernel:
            raise KeyboardInterrupt

    def _install_signal_handlers(self) -> dict:
        """Install :meth:`on_signal` for SIGTERM and SIGINT; returns the handlers it replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}  # signal handlers can only be set in the main thread
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        for s in previous:
            signal.signal(s, self.on_signal)
        if take_pending():  # Ctrl-C while the command started up: stop before the first case
            self.stop_reason = "interrupted"
        return previous


