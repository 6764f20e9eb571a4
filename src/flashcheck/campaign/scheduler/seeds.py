"""``fuzz --jobs N``'s policy: one campaign's cases shared out by seed, N workers that report what they find.

Worker i of N > 1 runs :func:`flashcheck.campaign.run.run_campaign` with the seed
``sha256(f"{seed}/job{i}")`` (:func:`job_seed`), ``max_examples // N`` drawn cases (the first
``max_examples % N`` one more: :func:`split_examples`) and every N-th cell of one covering plan. With a
seed, workers skip hypothesis's replay of the example database (what another worker saved a moment
before would change their cases): the seed and N alone fix each worker's cases.

A worker sends each finding's summary entry as soon as its case is saved, a progress snapshot at most every
:data:`PROGRESS_EVERY_S` and its summary at the end. A stop request (Ctrl-C, SIGTERM) asks every worker to
stop, again every second until all have ended, and kills those still running after
:data:`STOP_GRACE_S`. A worker that ended without a summary counts as its last snapshot and every
finding it reported, with a note on how it ended.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import time
import traceback
from dataclasses import dataclass, field

from ...errors import FlashcheckError
from ..bugs import bugs_with_findings
from ..combine import combine_summaries, combined_verdict
from ..config import CampaignConfig, CampaignHooks
from ..interrupts import defer_terminate
from ..messages import CampaignCrashed, CampaignRefused, Ended, FindingSaved, Finished, Progress
from ..result import CampaignResult
from ..summary import CampaignSummary
from ..transport import Worker, child_setup
from ..worker import WorkerProcess, exit_text
from . import JobError, Transport

__all__ = ["PROGRESS_EVERY_S", "STOP_GRACE_S", "SeedShares", "Totals", "job_seed", "split_examples"]

PROGRESS_EVERY_S = 0.5  # how often a worker sends the parent a snapshot of its counts
STOP_GRACE_S = 60.0     # after a stop request, how long workers have to send their summaries
_RESEND_S = 1.0         # a worker may get SIGTERM before its campaign handles it: ask again this often


def job_seed(seed: int | None, index: int, jobs: int) -> int | None:
    """Worker ``index``'s seed: the campaign's own with one worker, else derived from (seed, index)."""
    if seed is None or jobs == 1:
        return seed
    return int(hashlib.sha256(f"{seed}/job{index}".encode()).hexdigest()[:16], 16)


def split_examples(total: int, jobs: int) -> list[int]:
    """``total`` drawn cases over ``jobs`` workers: equal shares, the first ones one more for the rest."""
    return [total // jobs + (i < total % jobs) for i in range(jobs)]


def _campaign_child(channel, index: int, config: CampaignConfig) -> None:
    """A worker process: one campaign, its findings, snapshots and summary sent to the parent."""
    child_setup()
    defer_terminate()  # until the campaign takes it: a stop asked for while this process starts up
    worker_process = WorkerProcess()  # before this process imports torch: the two imports overlap
    from ..run import run_campaign  # torch and hypothesis: only once the kernel's worker is on its way

    hooks = CampaignHooks(progress=_Snapshots(channel), on_finding=lambda entry: channel.send(FindingSaved(entry)),
                          worker_process=worker_process)
    try:
        result = run_campaign(config, hooks)
    except FlashcheckError as exc:
        channel.send(CampaignRefused(str(exc)))
        return
    except Exception:
        traceback.print_exc()
        channel.send(CampaignCrashed(traceback.format_exc()))
        return
    channel.send(Finished(result.summary()))


class _Snapshots:
    """The campaign's progress callback in a worker: its counts, sent at most every PROGRESS_EVERY_S."""

    def __init__(self, channel):
        self.channel, self.next, self.start = channel, 0.0, time.monotonic()

    def __call__(self, result: CampaignResult) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + PROGRESS_EVERY_S
            # the campaign sets its elapsed time at the end; a worker that never gets there has this one
            snapshot = dataclasses.replace(result.summary(), elapsed_s=round(now - self.start, 3), case_log=None,
                                           case_log_sha256=None, records=None)
            self.channel.send(Progress(snapshot))


@dataclass(eq=False)
class _Reports:
    """What the parent has received from one worker."""

    worker: Worker
    seed: int | None
    findings: list = field(default_factory=list)  # every finding entry it reported
    snapshot: CampaignSummary | None = None       # its latest progress snapshot
    summary: CampaignSummary | None = None
    error: str | None = None                      # why it could not finish
    usage_error: bool = False

    @property
    def latest(self) -> CampaignSummary | None:
        return self.summary or self.snapshot


@dataclass
class Totals:
    """What the parent knows of all workers together: what a progress callback reads of a campaign."""

    cases: int = 0
    examples: int = 0
    by_status: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @classmethod
    def of(cls, reports: list[_Reports]) -> "Totals":
        totals = cls(findings=[f for r in reports for f in r.findings])
        for latest in (r.latest for r in reports):
            if latest is not None:
                totals.cases += latest.cases
                totals.examples += latest.examples
                for status, n in latest.counts.get("by_status", {}).items():
                    totals.by_status[status] = totals.by_status.get(status, 0) + n
        return totals


def _keep(findings: list, entry: dict) -> None:
    """``entry`` in ``findings``: in place of the one saved at its path (sent again once its bug was named)."""
    at = next((i for i, f in enumerate(findings) if f.get("path") == entry.get("path")), None)
    if at is None:
        findings.append(entry)
    else:
        findings[at] = entry


class SeedShares:
    """The policy of ``fuzz --jobs``: ``config``'s campaign in ``jobs`` workers, each with its seed and its
    share of the cases; ``progress(totals)`` gets a :class:`Totals` whenever a worker reports."""

    name = "flashcheck-fuzz"
    child = staticmethod(_campaign_child)

    def __init__(self, config: CampaignConfig, jobs: int, progress=None):
        self.config, self.progress = config, progress
        total, seed = config.max_examples, config.drawing.seed
        shares = [n for n in split_examples(total, jobs) if n > 0]
        # The workers share one covering plan, each taking every len(shares)-th of its cells.
        plan_seed = seed if seed is not None else random.randrange(2**32)
        self.configs = [config.replace(max_examples=n, seed=job_seed(seed, i, jobs), reuse=seed is None,
                                       corpus=str(config.storage.corpus), plan=(plan_seed, i, len(shares), total))
                        for i, n in enumerate(shares)]
        self.reports: dict[Worker, _Reports] = {}
        self.transport: Transport | None = None
        self.stop_since: float | None = None
        self.last_sent = -math.inf

    def payloads(self) -> list[CampaignConfig]:
        return self.configs

    def started(self, workers: list[Worker], transport: Transport) -> None:
        self.transport = transport
        self.reports = {w: _Reports(w, self.configs[w.index].drawing.seed) for w in workers}

    def handle(self, worker: Worker, message) -> None:
        report = self.reports[worker]
        match message:
            case FindingSaved(entry=entry):
                _keep(report.findings, entry)
            case Progress(snapshot=snapshot):
                report.snapshot = snapshot
            case Finished(summary=summary):
                report.summary = summary
            case CampaignRefused(error=text) | CampaignCrashed(traceback=text):  # the others would fail alike
                report.error, report.usage_error = text, isinstance(message, CampaignRefused)
                self.request_stop()
            case Ended():
                return
        if self.progress is not None:
            self.progress(Totals.of(list(self.reports.values())))

    def request_stop(self, *_) -> None:
        """A signal handler too: only a flag, which :meth:`tick` passes on to the workers."""
        self.stop_since = self.stop_since or time.monotonic()

    def tick(self) -> None:
        if self.stop_since is None:
            return
        now = time.monotonic()
        running = [r.worker for r in self.reports.values()
                   if r.summary is None and self.transport.alive(r.worker)]
        if now - self.stop_since > STOP_GRACE_S:
            for worker in running:
                self.transport.kill(worker)
        elif now - self.last_sent >= _RESEND_S:
            self.last_sent = now
            for worker in running:
                self.transport.terminate(worker)  # SIGTERM, unless it has ended meanwhile

    def summary(self, kernel_name: str) -> CampaignSummary:
        """Every worker's summary combined (one that ended without its own: what it sent)."""
        reports = list(self.reports.values())
        usage = [r.error for r in reports if r.usage_error]
        if usage and not any(r.latest is not None and r.latest.cases for r in reports):
            raise JobError(f"{usage[0]} (reported by the --jobs worker processes)")
        summaries = [r.summary or self._partial_summary(r, kernel_name) for r in reports]
        combined = combine_summaries(summaries, sources=[f"worker{r.worker.index}" for r in reports])
        sources = [{**entry, "gpu": r.worker.gpu, "stopped": s.stopped,
                    "exit": None if r.summary else exit_text(self.transport.exitcode(r.worker))}
                   for entry, r, s in zip(combined.sources, reports, summaries)]
        return dataclasses.replace(combined, sources=sources, seed=self.config.drawing.seed, jobs=len(reports))

    def _partial_summary(self, report: _Reports, kernel_name: str) -> CampaignSummary:
        """A summary for a worker that ended without one: its last snapshot, and every finding it reported."""
        target = self.config.target
        base = report.snapshot or CampaignResult(verdict="", kernel=kernel_name, device=str(target.device),
                                                 preset=target.preset.name, seed=report.seed,
                                                 isolation="worker").summary()
        exit_code = self.transport.exitcode(report.worker)
        how = "failed (" + report.error.strip().splitlines()[-1] + ")" if report.error else \
            f"ended ({exit_text(exit_code)})"
        note = (f"worker {report.worker.index} {how} without a summary: its counts are those of its last progress "
                f"report ({base.cases} cases), its findings the {len(report.findings)} it reported")
        partial = dataclasses.replace(
            base, findings=list(report.findings), stopped="worker_failed" if report.error else "worker_died",
            notes=list(base.notes or []) + [note], case_log=None, case_log_sha256=None,
            bugs=bugs_with_findings(base.bugs or [], report.findings))
        return dataclasses.replace(partial, verdict=combined_verdict([partial]))
