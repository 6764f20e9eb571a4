"""``fuzz --jobs N``'s policy (and ``--cluster``'s): one campaign's cases shared out by seed, N workers that report
what they find.

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

On a transport that can start a worker in place of another (a cluster's), a worker that ended before its share
was done is followed by one that takes what is left of it (:mod:`.shares`), and the summary's ``lost`` says
which worker ended, after how many cases, and whether another took its share on. With a seed, every worker
writes its progress in the corpus (:mod:`flashcheck.campaign.progress`), and a campaign whose driver died is
resumed by the same command: each share goes on where its record ends, by the same rules.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
import traceback
from dataclasses import dataclass, field

from ...errors import FlashcheckError
from ..combine import combine_summaries
from ..config import CampaignConfig, CampaignHooks
from ..interrupts import defer_terminate
from ..messages import CampaignCrashed, CampaignRefused, Ended, FindingSaved, Finished, Progress
from ..progress import (
    RunRecord,
    campaign_key,
    mark_done,
    progress_folder,
    read_losses,
    read_runs,
    record_loss,
    unfinished_runs,
)
from ..result import CampaignResult, keep_finding
from ..summary import CampaignSummary
from ..transport import Worker, child_setup
from ..worker import WorkerProcess
from . import JobError, Transport
from .shares import Run, Share, ShareRun, job_seed

__all__ = ["PROGRESS_EVERY_S", "STOP_GRACE_S", "SeedShares", "Totals", "job_seed", "split_examples"]

PROGRESS_EVERY_S = 0.5  # how often a worker sends the parent a snapshot of its counts
STOP_GRACE_S = 60.0     # after a stop request, how long workers have to send their summaries
_RESEND_S = 1.0         # a worker may get SIGTERM before its campaign handles it: ask again this often
_EARLIER = "ended without a summary in an earlier run of this command, whose driver died"


def split_examples(total: int, jobs: int) -> list[int]:
    """``total`` drawn cases over ``jobs`` workers: equal shares, the first ones one more for the rest."""
    return [total // jobs + (i < total % jobs) for i in range(jobs)]


def _campaign_child(channel, index: int, order: ShareRun) -> None:
    """A worker process: one campaign, its findings, snapshots and summary sent to the parent (and written in the
    progress record, where one is kept)."""
    child_setup()
    defer_terminate()  # until the campaign takes it: a stop asked for while this process starts up
    worker_process = WorkerProcess()  # before this process imports torch: the two imports overlap
    from ..run import run_campaign  # torch and hypothesis: only once the kernel's worker is on its way

    outbox = _Outbox(channel, RunRecord(order.record, index, order.run) if order.record else None)
    hooks = CampaignHooks(progress=outbox.progress, on_finding=outbox.finding, worker_process=worker_process)
    try:
        result = run_campaign(order.config, hooks)
    except FlashcheckError as exc:
        channel.send(CampaignRefused(str(exc)))
        return
    except Exception:
        traceback.print_exc()
        channel.send(CampaignCrashed(traceback.format_exc()))
        return
    outbox.finished(result.summary())


class _Outbox:
    """What a worker tells the parent: each finding at once, its counts at most every PROGRESS_EVERY_S, its
    summary; each also in its progress ``record`` first, with every drawn case (None: none kept)."""

    def __init__(self, channel, record: RunRecord | None):
        self.channel, self.record, self.next, self.start, self.drawn = channel, record, 0.0, time.monotonic(), 0

    def progress(self, result: CampaignResult) -> None:
        if self.record is not None and result.examples > self.drawn:  # a drawn case was just counted
            self.drawn = result.examples
            self.record.drawn(result.case_log[-1])
        now = time.monotonic()
        if now >= self.next:
            self.next = now + PROGRESS_EVERY_S
            # the campaign sets its elapsed time at the end; a worker that never gets there has this one
            snapshot = dataclasses.replace(result.summary(), elapsed_s=round(now - self.start, 3), case_log=None,
                                           case_log_sha256=None, records=None)
            if self.record is not None:
                self.record.snapshot(snapshot)
            self.channel.send(Progress(snapshot))

    def finding(self, entry: dict) -> None:
        if self.record is not None:
            self.record.finding(entry)
        self.channel.send(FindingSaved(entry))

    def finished(self, summary: CampaignSummary) -> None:
        if self.record is not None:
            self.record.snapshot(summary, final=True)
            self.record.close()
        self.channel.send(Finished(summary))


@dataclass
class Totals:
    """What the parent knows of all workers together: what a progress callback reads of a campaign."""

    cases: int = 0
    examples: int = 0
    by_status: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @classmethod
    def of(cls, runs: list[Run]) -> "Totals":
        totals = cls(findings=[f for r in runs for f in r.findings])
        for latest in (r.latest for r in runs):
            if latest is not None:
                totals.cases += latest.cases
                totals.examples += latest.examples
                for status, n in latest.counts.get("by_status", {}).items():
                    totals.by_status[status] = totals.by_status.get(status, 0) + n
        return totals


class SeedShares:
    """The policy of ``fuzz --jobs`` (and ``--cluster``): ``config``'s campaign in ``jobs`` workers, each with its
    seed and its share of the cases; ``progress(totals)`` gets a :class:`Totals` whenever a worker reports."""

    name = "flashcheck-fuzz"
    child = staticmethod(_campaign_child)

    def __init__(self, config: CampaignConfig, jobs: int, progress=None):
        self.config, self.progress = config, progress
        total, seed = config.max_examples, config.drawing.seed
        counts = [n for n in split_examples(total, jobs) if n > 0]
        # The workers share one covering plan, each taking every len(counts)-th of its cells.
        plan_seed = seed if seed is not None else random.randrange(2**32)
        self.shares = [Share(i, n, config.time_budget, config.replace(
            max_examples=n, seed=job_seed(seed, i, jobs), reuse=seed is None, corpus=str(config.storage.corpus),
            plan=(plan_seed, i, len(counts), total)), seed) for i, n in enumerate(counts)]
        # With a seed, the same command finds its record again: a driver that died is resumed.
        self.folder = None if seed is None else progress_folder(config.storage.corpus, campaign_key(config, jobs))
        self.starting = self._resume()
        self.by_worker: dict[Worker, Run] = {}
        self.transport: Transport | None = None
        self.stop_since: float | None = None
        self.last_sent = -math.inf

    @property
    def jobs(self) -> int:
        return len(self.shares)

    @property
    def keep_going(self) -> bool:
        return self.config.limits.keep_going

    def _resume(self) -> list[Run]:
        """The runs to start: each share's next, after the runs an earlier driver of this campaign left in the
        record (it died), each where it ended; the summary tells those that ended before their share was done."""
        for recorded in unfinished_runs(self.folder) if self.folder is not None else []:
            if recorded.index < self.jobs:
                share = self.shares[recorded.index]
                run = Run(share, recorded.generation, share.first, findings=recorded.findings,
                          recorded=len(recorded.drawn), ended=_EARLIER, earlier=True)
                run.summary, run.snapshot = (recorded.snapshot, None) if recorded.final else (None, recorded.snapshot)
                share.runs.append(run)
        starting = [r for r in (s.next_run(self.keep_going, self.jobs) for s in self.shares) if r is not None]
        known = read_losses(self.folder) if self.folder is not None else {}
        for run, after in ((r, a) for s in self.shares for r, a in zip(s.runs, s.runs[1:] + [None]) if r.earlier):
            said = known.get(run.name)  # what the earlier driver saw, unless this one decided otherwise
            if said is not None and said.get("restarted_as") == (after.name if after else None):
                run.lost, run.ended = said, said.get("ended") or run.ended
            else:
                run.lost = self._lost(run, after, "its share was done")
        return starting

    def payloads(self) -> list[ShareRun]:
        record = None if self.folder is None else str(self.folder)
        return [ShareRun(run.config, run.number, record) for run in self.starting]

    def started(self, workers: list[Worker], transport: Transport) -> None:
        self.transport = transport
        self.by_worker = {w: run for w, run in zip(workers, self.starting)}
        for worker, run in self.by_worker.items():
            run.worker = worker

    def handle(self, worker: Worker, message) -> None:
        run = self.by_worker[worker]
        match message:
            case FindingSaved(entry=entry):
                keep_finding(run.findings, entry)
            case Progress(snapshot=snapshot):
                run.snapshot = snapshot
            case Finished(summary=summary):
                run.summary = summary
            case CampaignRefused(error=text) | CampaignCrashed(traceback=text):  # the others would fail alike
                run.error, run.usage_error = text, isinstance(message, CampaignRefused)
                self.request_stop()
            case Ended():
                self._ended(run)
                return
        if self.progress is not None:
            self.progress(Totals.of(self._runs()))

    def _ended(self, run: Run) -> None:
        """A worker's end: where its share is not done and the transport can, another worker takes what is left."""
        run.ended = self.transport.how_ended(run.worker)
        if not (self.transport.replaces and run.unfinished) or run.error or self.stop_since is not None:
            return
        if self.folder is not None:  # what it drew, up to its last case (its last report may be older)
            run.recorded = next((len(r.drawn) for r in read_runs(self.folder)
                                 if (r.index, r.generation) == (run.share.index, run.number)), 0)
        successor = run.share.next_run(self.keep_going, self.jobs)
        worker = None
        if successor is not None:
            record = None if self.folder is None else str(self.folder)
            worker = self.transport.replace(run.worker, ShareRun(successor.config, successor.number, record))
            if worker is None:
                run.share.runs.remove(successor)
            else:
                successor.worker, self.by_worker[worker] = worker, successor
        why = "no node had the resources free for it" if successor is not None else \
            f"its share was taken on by {len(run.share.runs)} workers, each lost" if run.share.exhausted else \
            "its share was done"
        run.lost = self._lost(run, successor if worker is not None else None, why)
        if run.lost is not None and self.folder is not None:
            record_loss(self.folder, run.lost)

    def _lost(self, run: Run, successor: Run | None, why: str) -> dict | None:
        """What the summary says of a run that ended before its share was done (``why``: why no successor)."""
        if not run.unfinished:
            return None
        ours = successor is not None and not successor.earlier  # what an earlier driver's run had left is unknown
        left = {"cases": successor.config.max_examples, "seconds": successor.config.limits.time_budget} if ours \
            else None
        return {"worker": run.name, "cases": run.latest.cases if run.latest else 0, "drawn": run.drawn,
                "ended": run.ended, "restarted_as": None if successor is None else successor.name, "left": left,
                "not_restarted": None if successor is not None else why}

    def _runs(self) -> list[Run]:
        return [run for share in self.shares for run in share.runs]

    def request_stop(self, *_) -> None:
        """A signal handler too: only a flag, which :meth:`tick` passes on to the workers."""
        self.stop_since = self.stop_since or time.monotonic()

    def tick(self) -> None:
        if self.stop_since is None:
            return
        now = time.monotonic()
        running = [w for w, r in self.by_worker.items() if r.summary is None and self.transport.alive(w)]
        if now - self.stop_since > STOP_GRACE_S:
            for worker in running:
                self.transport.kill(worker)
        elif now - self.last_sent >= _RESEND_S:
            self.last_sent = now
            for worker in running:
                self.transport.terminate(worker)  # SIGTERM, unless it has ended meanwhile

    def summary(self, kernel_name: str) -> CampaignSummary:
        """Every run's summary combined (one that ended without its own: what it sent)."""
        runs = self._runs()
        usage = [r.error for r in runs if r.usage_error]
        if usage and not any(r.latest is not None and r.latest.cases for r in runs):
            raise JobError(f"{usage[0]} (reported by the --jobs worker processes)")
        for run in runs:  # the transport has ended them all now: a process's exit status is in
            if run.worker is not None:
                run.ended = self.transport.how_ended(run.worker)
        summaries = [r.summary or r.partial_summary(kernel_name) for r in runs]
        combined = combine_summaries(summaries, sources=[r.name for r in runs])
        sources = [{**entry, "gpu": r.worker.gpu if r.worker else None, "stopped": s.stopped,
                    "exit": None if r.summary else r.ended, **({"node": r.worker.node} if r.worker and r.worker.node
                                                              else {})}
                   for entry, r, s in zip(combined.sources, runs, summaries)]
        lost = [r.lost for r in runs if r.lost is not None]
        return dataclasses.replace(combined, sources=sources, seed=self.config.drawing.seed, jobs=self.jobs,
                                   lost=lost or None)

    def end_record(self) -> None:
        """The campaign ended with its summary: the same command starts it afresh."""
        if self.folder is not None:
            mark_done(self.folder)
