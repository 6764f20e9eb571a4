"""``fuzz --jobs N``: one campaign spread over N processes (the self-test's rows use the same processes:
:mod:`flashcheck.selftest.parallel`).

**Campaigns.** :func:`run_campaigns` starts N worker processes ("spawn" children), each running
:func:`flashcheck.campaign.run.run_campaign` with a hypothesis engine and a seed of its own, its kernel in a
kernel worker process as usual, all sharing one corpus and one example database. The parent shows one
progress display and writes one summary: :func:`flashcheck.campaign.merge.merge_summaries` of the workers'
summaries, with one entry per worker in ``sources`` and ``"jobs": N``.

*Determinism.* Worker i of N > 1 draws with the seed ``sha256(f"{seed}/job{i}")`` (one seed fixes every
worker, as :func:`~flashcheck.campaign.run.run_campaign` derives one per round) and runs ``max_examples // N``
drawn cases, the first ``max_examples % N`` workers one more. Hypothesis's reuse phase replays what the
example database holds when a worker starts, which could be what another worker saved a moment before;
with a seed, workers therefore skip that phase (they still write the database, so a campaign without a
seed, here or on another machine, replays their failures first), and the seed and N alone fix each
worker's cases. Without a seed every worker replays the shared database, as fuzzers share findings.

*GPUs.* Worker i gets the (i mod n)-th of the n visible GPUs through ``CUDA_VISIBLE_DEVICES``, set in its
environment before it starts (so before it imports torch); N may exceed n. On the CPU nothing is set.

*Starting.* The workers start before the parent resolves the kernel (the parent's usage errors still come
first: they are raised, and the workers killed, before any case is waited for), and each worker starts
its kernel's worker process (:class:`flashcheck.campaign.worker.WorkerProcess`) before it imports torch itself, so
the imports overlap. Only on a GPU with ``CUDA_VISIBLE_DEVICES`` unset does the parent import torch
before starting them, to count the GPUs. Their ``first_case_s`` count from the parent's start; the
merged one is the earliest.

*Nothing found is lost.* A worker sends the parent each finding's summary entry as soon as its case is
saved (the corpus has it already), a progress snapshot at most every half second, and its summary at
the end, over a pipe of its own, which keeps what was sent even when the worker is killed. On Ctrl-C or
SIGTERM the parent sends every worker SIGTERM (a campaign's own interruption: it stops at a safe point,
keeps its shrink's progress and returns its summary), again every second until they have all ended, and
kills those still running after ``STOP_GRACE_S``. A worker that ended without a summary is merged from
what it sent: its last snapshot's counts and every finding it reported, with a note on how it ended, so
the merged verdict still counts its findings.
"""

from __future__ import annotations

import hashlib
import math
import random
import signal
import threading
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from ..errors import FlashcheckError, InvalidArgument
from .bugs import bugs_with_findings
from .interrupts import defer_terminate, take_pending
from .jobs import Job, JobError, check_jobs, child_setup, end_jobs, messages, start_jobs
from .merge import merge_summaries, merged_verdict
from .worker import exit_text

__all__ = ["Totals", "job_seed", "run_campaigns", "split_examples"]

PROGRESS_EVERY_S = 0.5  # how often a worker sends the parent a snapshot of its counts
STOP_GRACE_S = 60.0     # after a stop request, how long workers have to send their summaries
_RESEND_S = 1.0         # a worker may get SIGTERM before its campaign handles it: ask again this often
_POLL_S = 0.25


def job_seed(seed: int | None, index: int, jobs: int) -> int | None:
    """Worker ``index``'s seed: the campaign's own with one worker, else derived from (seed, index)."""
    if seed is None or jobs == 1:
        return seed
    return int(hashlib.sha256(f"{seed}/job{index}".encode()).hexdigest()[:16], 16)


def split_examples(total: int, jobs: int) -> list[int]:
    """``total`` drawn cases over ``jobs`` workers: equal shares, the first ones one more for the rest."""
    return [total // jobs + (i < total % jobs) for i in range(jobs)]


def _campaign_child(conn, index: int, options: dict) -> None:
    """A worker process: one campaign, its findings, snapshots and summary sent to the parent."""
    child_setup()
    defer_terminate()  # until the campaign takes it: a stop asked for while this process starts up
    from .worker import WorkerProcess

    worker_process = WorkerProcess()  # before this process imports torch: the two imports overlap
    from .run import run_campaign

    def send(kind, payload):
        conn.send((kind, payload))

    try:
        result = run_campaign(**options, on_finding=lambda entry: send("finding", entry), progress=_Snapshots(send),
                              worker_process=worker_process)
    except FlashcheckError as exc:
        send("usage", str(exc))
        return
    except Exception:
        traceback.print_exc()
        send("failed", traceback.format_exc())
        return
    send("summary", result.as_dict())


class _Snapshots:
    """The campaign's progress callback in a worker: its counts, sent at most every PROGRESS_EVERY_S."""

    def __init__(self, send):
        self.send, self.next, self.start = send, 0.0, time.monotonic()

    def __call__(self, result) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + PROGRESS_EVERY_S
            # the campaign sets its elapsed time at the end; a worker that never gets there has this one
            self.send("progress", {**result.as_dict(), "elapsed_s": round(now - self.start, 3), "case_log": None,
                                   "case_log_sha256": None, "records": None})


@dataclass
class Totals:
    """What the parent knows of all workers together: what a progress callback reads of a campaign."""

    cases: int = 0
    examples: int = 0
    by_status: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @classmethod
    def of(cls, jobs: list[Job]) -> "Totals":
        totals = cls(findings=[f for job in jobs for f in job.findings])
        for job in jobs:
            latest = job.summary or job.snapshot or {}
            totals.cases += latest.get("cases", 0)
            totals.examples += latest.get("examples", 0)
            for status, n in latest.get("counts", {}).get("by_status", {}).items():
                totals.by_status[status] = totals.by_status.get(status, 0) + n
        return totals


class _StopRequests:
    """The parent's SIGINT/SIGTERM handler: a flag; :meth:`tick` passes it on to the workers."""

    def __init__(self, jobs: list[Job]):
        self.jobs, self.since, self.last_sent = jobs, None, -math.inf

    def request(self, *_) -> None:
        self.since = self.since or time.monotonic()

    def tick(self) -> None:
        if self.since is None:
            return
        now = time.monotonic()
        running = [job for job in self.jobs if job.summary is None and job.process.is_alive()]
        if now - self.since > STOP_GRACE_S:
            for job in running:
                job.process.kill()
        elif now - self.last_sent >= _RESEND_S:
            self.last_sent = now
            for job in running:
                job.process.terminate()  # SIGTERM, unless it has ended meanwhile

    @contextmanager
    def installed(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {s: signal.getsignal(s) for s in handled} \
            if threading.current_thread() is threading.main_thread() else {}
        for s in previous:
            signal.signal(s, self.request)
        if take_pending():  # Ctrl-C while the command started up
            self.request()
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def run_campaigns(kernel: str, *, jobs: int, device: str, preset, dtypes=None, max_examples: int | None = None,
                  time_budget: float | None = None, seed: int | None = None, corpus="flashcheck-corpus",
                  database=None, keep_going: bool = False, case_timeout: float | None = None,
                  kernel_options: dict | None = None, progress=None, started_at: float | None = None,
                  backward: bool = False, records: bool = False) -> dict:
    """One campaign of ``kernel`` (a name: each worker resolves it) in ``jobs`` worker processes; returns
    the merged summary. ``progress(totals)`` gets a :class:`Totals` whenever a worker reports.
    ``started_at`` (``time.monotonic()``, default now) is what each worker's ``first_case_s`` counts from."""
    check_jobs(jobs, "jobs")
    if not isinstance(kernel, str):
        raise InvalidArgument("kernel", kernel, "worker processes resolve the kernel by its name",
                              "Pass a built-in name or 'package.module:function', or run_campaign for an object.")
    started_at = time.monotonic() if started_at is None else started_at
    total = max_examples or preset.max_examples
    shares = [n for n in split_examples(total, jobs) if n > 0]
    # The workers share one covering plan, each taking every len(shares)-th of its cells.
    plan_seed = seed if seed is not None else random.randrange(2**32)
    # Each worker checks the options again (prepare_campaign) and keeps the dtypes its kernel supports.
    options = [dict(kernel=kernel, device=device, preset=preset, dtypes=dtypes, max_examples=n, time_budget=time_budget,
                    seed=job_seed(seed, i, jobs), corpus=str(corpus), database=database, keep_going=keep_going,
                    case_timeout=case_timeout, kernel_options=kernel_options, reuse=seed is None,
                    started_at=started_at, backward=backward, records=records,
                    plan=(plan_seed, i, len(shares), total))  # a PlanShare's fields: no torch import here
               for i, n in enumerate(shares)]
    stop = _StopRequests([])
    with stop.installed():
        # The workers start first and import while this process resolves the kernel for its own checks.
        running = stop.jobs = start_jobs(_campaign_child, options, device, "flashcheck-fuzz")
        try:
            from .setup import prepare_campaign

            resolved, _, _ = prepare_campaign(kernel, device=device, preset=preset, dtypes=dtypes, isolate=True,
                                              case_timeout=case_timeout, kernel_options=kernel_options,
                                              backward=backward)
        except BaseException:  # a usage error: the same in every worker, which need not get that far
            for job in running:
                job.process.kill()
            end_jobs(running)
            raise
        try:
            for job, kind, payload in messages(running, stop.tick):
                _receive(job, kind, payload, stop)
                if progress is not None:
                    progress(Totals.of(running))
        finally:
            end_jobs(running)
    return _merged(running, resolved.name, device, preset, seed)


def _receive(job: Job, kind: str, payload, stop: _StopRequests) -> None:
    if kind == "finding":
        job.findings.append(payload)
    elif kind == "progress":
        job.snapshot = payload
    elif kind == "summary":
        job.summary = payload
    else:  # "usage" or "failed": the others would fail alike, or stop anyway
        job.error, job.usage_error = payload, kind == "usage"
        stop.request()


def _merged(jobs: list[Job], kernel_name: str, device: str, preset, seed: int | None) -> dict:
    usage = [job.error for job in jobs if job.usage_error]
    if usage and not any((job.summary or job.snapshot or {}).get("cases") for job in jobs):
        raise JobError(f"{usage[0]} (reported by the --jobs worker processes)")
    summaries = [job.summary or _partial_summary(job, kernel_name, device, preset) for job in jobs]
    merged = merge_summaries(summaries, sources=[f"worker{job.index}" for job in jobs])
    for entry, job, summary in zip(merged["sources"], jobs, summaries):
        entry.update(gpu=job.gpu, stopped=summary["stopped"],
                     exit=None if job.summary else exit_text(job.process.exitcode))
    merged.update(seed=seed, jobs=len(jobs))
    _add_new_counts(merged, summaries)
    return merged


def _partial_summary(job: Job, kernel_name: str, device: str, preset) -> dict:
    """A summary for a worker that ended without one: its last snapshot, and every finding it reported."""
    from .result import CampaignResult

    base = job.snapshot or CampaignResult(verdict="", kernel=kernel_name, device=str(device), preset=preset.name,
                                          seed=job.seed, isolation="worker").as_dict()
    how = "failed (" + job.error.strip().splitlines()[-1] + ")" if job.error else \
        f"ended ({exit_text(job.process.exitcode)})"
    note = (f"worker {job.index} {how} without a summary: its counts are those of its last progress report "
            f"({base['cases']} cases), its findings the {len(job.findings)} it reported")
    summary = {**base, "findings": list(job.findings), "stopped": "worker_failed" if job.error else "worker_died",
               "notes": list(base.get("notes") or []) + [note], "case_log": None, "case_log_sha256": None,
               "bugs": bugs_with_findings(base.get("bugs") or [], job.findings)}
    summary["verdict"] = merged_verdict([summary])
    return summary


def _add_new_counts(merged: dict, summaries: list[dict]) -> None:
    # merge_summaries predates these two keys; setdefault leaves its own sums once it has them.
    from .result import count_skip_reasons

    reasons: Counter = Counter()
    for s in summaries:
        count_skip_reasons(reasons, s.get("skipped_reasons") or {})
    merged.setdefault("skipped_reasons", dict(reasons))
    merged.setdefault("compilations", sum(s.get("compilations") or 0 for s in summaries))
