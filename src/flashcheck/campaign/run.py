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
shrunk. Each distinct numerical BUG is named once by a defect model (:mod:`.naming`). The summary leads with the
distinct bugs (:mod:`flashcheck.campaign.bugs`); the raw findings follow.
Hypothesis stops at the first failure, so each bug ends a round and the next round draws the remaining
examples with fresh randomness (derived from the seed, so a seed still fixes every case). Over several
dtypes, each dtype draws its share of the cases and of the time in an engine of its own, one after the
other, with the example database's keys apart; the failures stored for every dtype replay first.

The summary's ``first_case_s`` is the time a user waits for the first result: seconds from ``started_at``
(``flashcheck fuzz``: the start of its process, :func:`flashcheck.campaign.clock.process_start`; by default the
call of :func:`run_campaign`) to the end of the first judged case (None while no case was judged). A
worker process started before this one imported torch (``CampaignHooks.worker_process``) loads the kernel meanwhile.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
from hypothesis import event

from ..inputs.case import AttentionCase
from ..inputs.covering import PlanShare, empty_coverage
from ..inputs.drawing import draw_device
from ..inputs.layout import Layout
from ..inputs.recipe import Recipe
from ..inputs.recipe_draws import recipe_pools, recipes
from ..inputs.sizes import host_memory_problem
from ..judge.backward import judge_case
from ..judge.verdict import BUG, PASS, RATIO_CEILING, SUSPICIOUS, Verdict
from .causes import Cause, needs_layout_triage, root_cause
from .corpus import save_finding
from .config import CampaignConfig, CampaignHooks
from .database import KeyedDatabase, campaign_scope, open_database
from .interrupts import handle_signals, restore_handlers
from .naming import BugNames
from .quantized import sample_quantization_error
from .result import TRIAGE, CampaignResult, finding_entry, record_row
from .rounds import Schedule, Stop
from .setup import Prepared, prepare_campaign, warm_oracle
from .share import PropertyShare
from .worker import KernelWorker, WorkerStartError
from .worker_child import drawn_or_skipped

__all__ = ["run_campaign"]

def run_campaign(config: CampaignConfig, hooks: CampaignHooks = CampaignHooks()) -> CampaignResult:
    """Run one campaign; never raises for what the kernel does (that is a finding).

    A kernel given by name runs in a worker process, restarted whenever it dies or hangs, unless the
    config's ``execution.isolate`` is False; a :class:`Kernel` or a callable runs in this process.
    ``hooks``: what the campaign calls back, and a worker process started before this process imported
    torch, which becomes the kernel's worker (told the kernel's name at once, it loads it while the campaign
    is prepared here); it is closed when this returns or raises, used or not.
    """
    started_at = time.monotonic() if config.started_at is None else config.started_at
    target, worker_process = config.target, hooks.worker_process
    try:
        if worker_process is not None and config.isolated:  # it loads the kernel meanwhile
            worker_process.assign(target.kernel, device=target.device, options=target.kernel_options)
        if not config.isolated:  # the oracle runs here; a worker process warms its own
            warm_oracle(target.device)
        prepared = prepare_campaign(config)
        campaign = _Campaign(config, prepared, hooks, started_at)
        return campaign.run(max_examples=config.max_examples, time_budget=config.time_budget)
    finally:
        if worker_process is not None:
            worker_process.close()  # nothing to do once the campaign's worker took it over


def _example_database(config: CampaignConfig, prepared: Prepared, spec, drawing: dict, drawn: str) -> KeyedDatabase:
    """The example database keyed to this campaign's scope, this kernel's entries only (``drawn``: drawing device)."""
    corpus = Path(config.storage.corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    database = open_database(config.storage.database, default_dir=corpus / ".hypothesis")  # a bad one fails here
    target = config.target
    # A case's numbers come from the generator of the device that draws it: a GPU's stored recipes are other cases
    # on the host, so the two keep their entries apart (a CPU campaign keeps the keys it always had).
    scope = campaign_scope(prepared.kernel, spec=spec, kernel_options=target.kernel_options, backward=target.backward,
                           drawing=drawing if drawn == "cpu" else {**drawing, "drawn_on": torch.device(drawn).type})
    return KeyedDatabase(database, scope)


# A case in flight at the time budget may run on for this share of the budget (at least GRACE_MIN_S).
GRACE_SHARE, GRACE_MIN_S = 0.1, 10.0


class _Campaign:
    """One campaign's state, shared by hypothesis's test body (:meth:`body`) and the loop over its rounds."""

    def __init__(self, config: CampaignConfig, prepared: Prepared, hooks: CampaignHooks, started_at: float):
        target = config.target
        self.resolved, self.device, self.seed = prepared.kernel, target.device, config.drawing.seed
        self.started_at = started_at
        self.backward = target.backward  # each case checks the backward pass, with a dO regime from its seed
        self.corpus = Path(config.storage.corpus)
        self.keep_going, self.progress, self.on_finding = config.limits.keep_going, hooks.progress, hooks.on_finding
        spec = self.resolved.spec.for_backward() if self.backward else self.resolved.spec
        drawing = target.preset.strategy_options()
        strategies = {d: recipes(spec=spec, dtypes=[d], **drawing) for d in prepared.dtypes}
        pools = {d: recipe_pools(spec=spec, dtypes=[d], **drawing) for d in prepared.dtypes}
        self.draw_on = draw_device(target.device)  # the host, or the campaign's GPU
        database = _example_database(config, prepared, spec, drawing, self.draw_on)
        self.worker = KernelWorker(target.kernel, device=target.device, options=target.kernel_options,
                                   case_timeout=config.execution.case_timeout, should_stop=self.should_stop,
                                   process=hooks.worker_process) if config.isolated else None
        self.result = CampaignResult(verdict=PASS, kernel=self.resolved.name, device=str(self.device),
                                     preset=target.preset.name, seed=self.seed,
                                     isolation="worker" if self.worker else "in-process",
                                     keep_going=self.keep_going, backward=self.backward,
                                     case_timeout=self.worker.case_timeout if self.worker else None)
        self.result.coverage = {d: empty_coverage(pools[d]) for d in prepared.dtypes}
        if config.storage.records:
            self.result.records = []
        self.stop_reason: str | None = None  # "interrupted", "time_budget" or "worker_failed"
        self.in_kernel = False               # a case runs in this process: only an exception can stop it
        self.explaining = False              # the defect models run: bounded by the case timeout, not the budget
        self.start = self.last_end = time.monotonic()
        self.first_case_at: float | None = None
        self.property_share = PropertyShare()
        plan = config.drawing.plan
        self.schedule = Schedule(self, strategies, pools=pools, database=database, seed=self.seed,
                                 reuse=config.drawing.reuse, keep_going=self.keep_going,
                                 plan=None if plan is None else PlanShare(*plan))
        self.saved_found: dict[str, dict] = {}  # causes whose first case is saved: its summary entry
        self.shrunk: set[str] = set()        # causes shrunk and saved: later cases are only counted
        self.names = BugNames(self)

    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def should_stop(self) -> bool:
        """Asked while a case runs in the worker: True on Ctrl-C. Past the campaign's time budget by its grace
        (a tenth of it, at least 10 s), the case is given up, unjudged, and the campaign ends: a kernel that
        compiles for minutes must not hold a time budget hostage."""
        if self.interrupted() or self.explaining:
            return not self.explaining
        until = self.schedule.until
        if time.monotonic() > until + max(GRACE_MIN_S, GRACE_SHARE * (until - self.start)):
            self.stop_reason = self.stop_reason or "time_budget"
            self.result.notes.append(f"a case still running {time.monotonic() - until:.0f} s past the time budget "
                                     "was given up, not judged")
            raise Stop()
        return False

    # ---- hypothesis's test body ---------------------------------------------------------------------

    def body(self, recipe: Recipe) -> None:
        rnd = self.schedule.round
        shrinking = rnd.signature is not None
        if self.interrupted():
            raise KeyboardInterrupt
        if self.stop_reason or time.monotonic() > self.schedule.deadline:
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
            raise Stop()
        # Out of time while shrinking: failures replay from memory and anything else passes, so that
        # hypothesis ends the shrink at once with the smallest failing case so far.
        self.schedule.round.out_of_time(recipe)

    def _run_case(self, recipe: Recipe, shrinking: bool) -> tuple | None:
        """``(verdict, case)`` (``case`` None if it passed in the worker), or None if no worker started to shrink."""
        self.result.time_split["draw"] += time.monotonic() - self.last_end  # hypothesis's draw, the bookkeeping
        # A skip, not a process killed with the campaign's results in it (a GPU that draws skips a case too large
        # for it itself).
        problem = host_memory_problem(recipe.shapes) if self.draw_on == "cpu" else None
        if problem is not None:
            described = f"{recipe.dtype} {recipe.shapes}"
            return Verdict.from_findings([], max_ratio=math.nan, skipped=f"oom: {problem}", kernel=self.resolved.name,
                                         case=described, regime=recipe.regime), None
        properties = () if self.backward else self.property_share.choose(recipe, shrinking=self._shrinking_kinds())
        try:
            # a kept record holds the field's rules on the same output too; shrink candidates keep none
            return self.judge_recipe(recipe, properties, anchors=self.result.records is not None and not shrinking)
        except WorkerStartError as exc:  # it loaded before: the machine or flashcheck, not the kernel, is failing now
            self.result.notes.append(f"stopped: a fresh worker process could not start or draw a case again: {exc}")
            self.stop_reason = "worker_failed"
            if shrinking:
                self.schedule.round.cut = True
                return None
            raise Stop() from None

    def judge_recipe(self, recipe: Recipe, properties: tuple, *, anchors: bool = False) -> tuple:
        """``(verdict, case)`` of the case drawn from ``recipe``: by the worker (``case`` None if it passed),
        or here; either way on the campaign's GPU if it has one (:mod:`flashcheck.inputs.drawing`)."""
        if self.worker is not None:
            return self.worker.check_recipe(recipe, properties=properties, backward=self.backward, anchors=anchors)
        start = time.perf_counter()
        case, skipped = drawn_or_skipped(recipe, kernel=self.resolved.name, device=self.device,
                                         backward=self.backward)
        drawn = time.perf_counter() - start
        verdict = skipped or self.judge(case, properties, anchors=anchors)
        verdict.elapsed["generation"] = drawn
        return verdict, case

    def _shrinking_kinds(self) -> frozenset | None:
        """The finding kinds of the bug being shrunk; None while hypothesis draws."""
        first = self.schedule.round.first
        return None if first is None else frozenset(f.kind for f in first[0].findings)

    def judge(self, case: AttentionCase, properties: tuple, *, anchors: bool = False) -> Verdict:
        if self.worker is not None:
            return self.worker.check(case, properties=properties)
        self.in_kernel = True
        try:
            return judge_case(self.resolved, case, device=self.device, properties=properties, anchors=anchors)
        finally:
            self.in_kernel = False

    def cause(self, verdict: Verdict, case: AttentionCase, recipe: Recipe) -> Cause:
        """The root cause of a failing case; one that fails in a non-contiguous layout first runs contiguous."""
        contiguous = None
        if needs_layout_triage(verdict, case.layout.name) and not self.interrupted():
            t0 = time.monotonic()
            try:
                # the rerun that names a cause tests the case's own layout, not the others
                properties = tuple(p for p in verdict.properties if p != "layout")
                contiguous = self.judge(case.with_layout(Layout.contiguous()), properties)
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
        self.last_end = time.monotonic()
        described = verdict.case if case is None else case.describe()
        r.count_case(verdict, f"{described} regime={recipe.regime} seed={recipe.seed}", recipe,
                     drawn=not shrinking)
        sample_quantization_error(r, verdict, case, recipe, drawn=not shrinking)
        self.property_share.record(verdict, recipe)
        if self.worker is not None:
            r.worker_restarts = self.worker.restarts
        if not shrinking:
            self.schedule.round.generated += 1
        else:
            self.schedule.round.shrink_tries += 1
        if not verdict.skipped:
            if r.first_case is None:
                r.first_case = self.last_end - self.started_at
                self.first_case_at = self.last_end
            self.schedule.round.climb.observe(min(verdict.max_ratio, RATIO_CEILING))
            event(f"regime {recipe.regime}")
            event(f"dtype {recipe.dtype}")
        if self.progress is not None:
            self.progress(r)
        return not verdict.skipped

    def _on_suspicious(self, verdict: Verdict, case: AttentionCase, recipe: Recipe, cause: Cause) -> None:
        r = self.result
        r.bug_signatures[cause.key] += 1
        r.bugs.count(cause, verdict, recipe)
        if cause.key not in self.saved_found:  # saved once, not shrunk: it passes the hard budget
            self.saved_found[cause.key] = self.save(verdict, case, cause, label="found", examples_at=r.examples)

    def _on_bug(self, verdict: Verdict, case: AttentionCase, recipe: Recipe, shrinking: bool, cause: Cause) -> None:
        rnd, r, sig = self.schedule.round, self.result, cause.key
        if not shrinking:
            r.bug_signatures[sig] += 1
        if not shrinking or sig != rnd.signature:  # a shrink's candidates count apart, for other bugs only
            r.bugs.count(cause, verdict, recipe, drawn=not shrinking)
        if sig not in self.saved_found:  # the case as first found, before shrinking (examples_at: drawn so far)
            self.saved_found[sig] = self.save(verdict, case, cause, label="found", examples_at=r.examples)
            self.names.found(verdict, case, cause, self.saved_found[sig])
        if sig in self.shrunk or (shrinking and sig != rnd.signature):
            return  # a bug already shrunk, or not the one this round shrinks: saved and counted, no failure
        if not shrinking:
            rnd.signature = sig
        rnd.fail(recipe, (verdict, case, cause))

    def save(self, verdict: Verdict, case: AttentionCase, cause: Cause, *, label: str, **extra) -> dict:
        """Save the case in the corpus; its summary entry."""
        path = save_finding(self.corpus, verdict, case, label=label, kernel=self.resolved)
        entry = {**finding_entry(verdict, case, path, cause, shrunk=label == "shrunk", device=self.device), **extra}
        self.result.findings.append(entry)
        self.result.bugs.saved(cause, verdict.status, entry)
        if self.on_finding is not None:
            self.on_finding(entry)
        if self.interrupted():
            raise KeyboardInterrupt
        return entry

    def record_shrunk(self, verdict: Verdict, case: AttentionCase, cause: Cause, *, complete: bool,
                      not_shrunk: str | None = None) -> None:
        """The end of a bug's shrink: its smallest case saved; or, ``not_shrunk`` (why), its case as found
        says why nothing smaller was looked for, and is not saved again under another name."""
        self.shrunk.add(cause.key)
        found = self.saved_found.get(cause.key)
        if not_shrunk and found is not None and found["case"] == verdict.case:
            found["shrink_note"] = not_shrunk
        else:
            found = self.save(verdict, case, cause, label="shrunk", shrink_complete=complete)
        self.names.final(verdict, case, cause, found)

    def run(self, *, max_examples: int, time_budget: float | None) -> CampaignResult:
        previous = self._install_signal_handlers()
        try:
            self._rounds(max_examples, time_budget)
            self.names.finish()  # the bugs never shrunk, with the kernel's worker still there
        finally:
            restore_handlers(previous)
            if self.worker is not None:
                self.worker.close()
                self.result.worker_restarts = self.worker.restarts
        return self._finish()

    def _rounds(self, max_examples: int, time_budget: float | None) -> None:
        try:
            if self.worker is not None:
                self.worker.start()  # a kernel that cannot load in the worker is a usage error, before any case
            # The clock starts once the kernel is loaded, as it did when the kernel loaded in this process.
            self.start = self.last_end = self.property_share.start = time.monotonic()
            self.result.stopped = self.schedule.run(max_examples, until=self.start + time_budget if time_budget else math.inf)
        except Stop:
            self.result.stopped = self.stop_reason or "time_budget"
        except KeyboardInterrupt:
            self.result.stopped = "interrupted"
            self._keep_shrink_progress()

    def _keep_shrink_progress(self) -> None:
        rnd = self.schedule.round
        if rnd.best is not None and rnd.best is not rnd.first and rnd.signature not in self.shrunk:
            try:  # keep the shrink's progress: the smallest failing case so far
                self.record_shrunk(*rnd.best, complete=False)
            except KeyboardInterrupt:
                pass

    def _finish(self) -> CampaignResult:
        r = self.result
        end = time.monotonic()
        r.elapsed = end - self.start
        r.properties = {"checked": []} if self.backward else self.property_share.as_dict(r.elapsed)
        if self.first_case_at is not None and r.cases > 1 and end > self.first_case_at:
            r.steady_rate = (r.cases - 1) / (end - self.first_case_at)
        r.conclude()
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
        previous, pending = handle_signals(self.on_signal)
        if pending:  # Ctrl-C while the command started up: stop before the first case
            self.stop_reason = "interrupted"
        return previous


