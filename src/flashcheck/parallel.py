"""``fuzz --jobs N`` and ``selftest --jobs N``: one campaign, or one self-test, spread over N processes.

**Campaigns.** :func:`run_campaigns` starts N worker processes ("spawn" children), each running
:func:`flashcheck.campaign.run_campaign` with a hypothesis engine and a seed of its own, its kernel in a
kernel worker process as usual, all sharing one corpus and one example database. The parent shows one
progress display and writes one summary: :func:`flashcheck.merge.merge_summaries` of the workers'
summaries, with one entry per worker in ``sources`` and ``"jobs": N``.

*Determinism.* Worker i of N > 1 draws with the seed ``sha256(f"{seed}/job{i}")`` (one seed fixes every
worker, as :func:`~flashcheck.campaign.run_campaign` derives one per round) and runs ``max_examples // N``
drawn cases, the first ``max_examples % N`` workers one more. Hypothesis's reuse phase replays what the
example database holds when a worker starts, which could be what another worker saved a moment before;
with a seed, workers therefore skip that phase (they still write the database, so a campaign without a
seed, here or on another machine, replays their failures first), and the seed and N alone fix each
worker's cases. Without a seed every worker replays the shared database, as fuzzers share findings.

*GPUs.* Worker i gets the (i mod n)-th of the n visible GPUs through ``CUDA_VISIBLE_DEVICES``, set in its
environment before it starts (so before it imports torch); N may exceed n. On the CPU nothing is set.

*Nothing found is lost.* A worker sends the parent each finding's summary entry as soon as its case is
saved (the corpus has it already), a progress snapshot at most every half second, and its summary at
the end, over a pipe of its own, which keeps what was sent even when the worker is killed. On Ctrl-C or
SIGTERM the parent sends every worker SIGTERM (a campaign's own interruption: it stops at a safe point,
keeps its shrink's progress and returns its summary), again every second until they have all ended, and
kills those still running after ``STOP_GRACE_S``. A worker that ended without a summary is merged from
what it sent: its last snapshot's counts and every finding it reported, with a note on how it ended, so
the merged verdict still counts its findings.

**Self-test.** :func:`run_selftest_rows` runs the self-test's rows (variant x dtype), which are
independent, in N processes that each take the next row when they finish one. A row's cases depend on
the seed and the row alone, so the rows are the same as in one process, returned in the same order.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import threading
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait

import torch.multiprocessing as mp

from .errors import FlashcheckError, InvalidArgument
from .merge import merge_summaries, merged_verdict
from .worker import _die_with_parent, _exit_text, quiet_interpreter

__all__ = ["JobError", "Totals", "check_jobs", "job_seed", "run_campaigns", "run_selftest_rows", "split_examples",
           "visible_gpus"]

PROGRESS_EVERY_S = 0.5  # how often a worker sends the parent a snapshot of its counts
STOP_GRACE_S = 60.0     # after a stop request, how long workers have to send their summaries
_RESEND_S = 1.0         # a worker may get SIGTERM before its campaign handles it: ask again this often
_POLL_S = 0.25


class JobError(FlashcheckError, RuntimeError):
    """A worker process could not run its part (the same usage error in every worker, as a rule)."""


def check_jobs(jobs, option: str = "--jobs") -> int:
    """``jobs`` if it is a whole number >= 1, else :class:`InvalidArgument` naming ``option``."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise InvalidArgument(option, jobs, "expected a number of worker processes, at least 1",
                              f"Pass e.g. {option} 4 (several per GPU are fine), or leave it out for one process.")
    return jobs


def job_seed(seed: int | None, index: int, jobs: int) -> int | None:
    """Worker ``index``'s seed: the campaign's own with one worker, else derived from (seed, index)."""
    if seed is None or jobs == 1:
        return seed
    return int(hashlib.sha256(f"{seed}/job{index}".encode()).hexdigest()[:16], 16)


def split_examples(total: int, jobs: int) -> list[int]:
    """``total`` drawn cases over ``jobs`` workers: equal shares, the first ones one more for the rest."""
    return [total // jobs + (i < total % jobs) for i in range(jobs)]


def visible_gpus(device: str) -> list[str]:
    """The GPUs workers spread over, as ``CUDA_VISIBLE_DEVICES`` entries; none on the CPU."""
    if not str(device).startswith("cuda"):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


# The thread pools of torch (OpenMP, MKL) and numpy (OpenBLAS) each take every core by default: N
# workers would run N times as many threads as cores (measured on an H200 host, 16 cores: 8 workers made
# generation 40x slower). Each worker gets its share, unless the user set the variable.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def threads_per_worker(jobs: int) -> str:
    return str(max(1, (os.cpu_count() or 1) // max(jobs, 1)))


@contextmanager
def _child_environment(values: dict):
    # A spawned child copies the parent's environment when it starts: set it for that moment only.
    values = {name: value for name, value in values.items() if value is not None}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class _Job:
    """One worker process and what the parent has received from it."""

    index: int
    process: object
    conn: object
    gpu: str | None
    seed: int | None = None
    findings: list = field(default_factory=list)  # every finding entry it reported
    snapshot: dict | None = None                  # its latest progress snapshot
    summary: dict | None = None
    error: str | None = None                      # why it could not finish ("usage" or "failed" text)
    usage_error: bool = False


def _start_jobs(target, payloads: list, device: str, name: str) -> list[_Job]:
    gpus = visible_gpus(device)
    ctx = mp.get_context("spawn")
    jobs = []
    for index, payload in enumerate(payloads):
        gpu = gpus[index % len(gpus)] if gpus else None
        parent_end, child_end = ctx.Pipe()
        # Not a daemon: it starts a kernel worker of its own. It dies with the parent all the same (prctl).
        process = ctx.Process(target=target, args=(child_end, index, payload), name=f"{name}-{index}")
        threads = {v: threads_per_worker(len(payloads)) for v in THREAD_VARIABLES if v not in os.environ}
        with _child_environment({"CUDA_VISIBLE_DEVICES": gpu, **threads}):
            process.start()
        child_end.close()  # so that the parent reads EOF once the child is gone
        jobs.append(_Job(index, process, parent_end, gpu, seed=payload.get("seed")))
    return jobs


def _messages(jobs: list[_Job], on_tick=None):
    """Every message of every job, as ``(job, kind, payload)``, until each job's pipe has closed."""
    open_conns = {job.conn: job for job in jobs}
    while open_conns:
        if on_tick is not None:
            on_tick()
        for conn in wait(list(open_conns), timeout=_POLL_S):
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):  # the worker has ended (what it sent before was read first)
                del open_conns[conn]
                continue
            yield open_conns[conn], kind, payload


def _end_jobs(jobs: list[_Job]) -> None:
    for job in jobs:
        job.process.join(timeout=5.0)
        if job.process.is_alive():
            job.process.kill()
            job.process.join(timeout=5.0)
        job.conn.close()


def _child_setup() -> None:
    # Ctrl-C reaches the whole process group; the parent decides what the workers do about it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    quiet_interpreter()


# ------------------------------------------------------------------------------------------------
# Campaigns
# ------------------------------------------------------------------------------------------------


def _campaign_child(conn, index: int, options: dict) -> None:
    """A worker process: one campaign, its findings, snapshots and summary sent to the parent."""
    _child_setup()
    signal.signal(signal.SIGTERM, lambda *_: None)  # until the campaign handles it; the parent asks again
    from .campaign import run_campaign

    def send(kind, payload):
        conn.send((kind, payload))

    try:
        result = run_campaign(**options, on_finding=lambda entry: send("finding", entry), progress=_Snapshots(send))
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
                                   "case_log_sha256": None})


@dataclass
class Totals:
    """What the parent knows of all workers together: what a progress callback reads of a campaign."""

    cases: int = 0
    examples: int = 0
    by_status: dict = field(default_factory=dict)
    findings: list = field(default_factory=list)

    @classmethod
    def of(cls, jobs: list[_Job]) -> "Totals":
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

    def __init__(self, jobs: list[_Job]):
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
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def run_campaigns(kernel: str, *, jobs: int, device: str, preset, dtypes=None, max_examples: int | None = None,
                  time_budget: float | None = None, seed: int | None = None, corpus="flashcheck-corpus",
                  database=None, keep_going: bool = False, case_timeout: float | None = None,
                  kernel_options: dict | None = None, progress=None) -> dict:
    """One campaign of ``kernel`` (a name: each worker resolves it) in ``jobs`` worker processes; returns
    the merged summary. ``progress(totals)`` gets a :class:`Totals` whenever a worker reports."""
    from .campaign import prepare_campaign

    check_jobs(jobs, "jobs")
    if not isinstance(kernel, str):
        raise InvalidArgument("kernel", kernel, "worker processes resolve the kernel by its name",
                              "Pass a built-in name or 'package.module:function', or run_campaign for an object.")
    resolved, _, dtypes = prepare_campaign(kernel, device=device, preset=preset, dtypes=dtypes, isolate=True,
                                           case_timeout=case_timeout, kernel_options=kernel_options)
    shares = split_examples(max_examples or preset.max_examples, jobs)
    options = [dict(kernel=kernel, device=device, preset=preset, dtypes=dtypes, max_examples=n, time_budget=time_budget,
                    seed=job_seed(seed, i, jobs), corpus=str(corpus), database=database, keep_going=keep_going,
                    case_timeout=case_timeout, kernel_options=kernel_options, reuse=seed is None)
               for i, n in enumerate(shares) if n > 0]
    stop = _StopRequests([])
    with stop.installed():
        running = stop.jobs = _start_jobs(_campaign_child, options, device, "flashcheck-fuzz")
        try:
            for job, kind, payload in _messages(running, stop.tick):
                _receive(job, kind, payload, stop)
                if progress is not None:
                    progress(Totals.of(running))
        finally:
            _end_jobs(running)
    return _merged(running, resolved.name, device, preset, seed)


def _receive(job: _Job, kind: str, payload, stop: _StopRequests) -> None:
    if kind == "finding":
        job.findings.append(payload)
    elif kind == "progress":
        job.snapshot = payload
    elif kind == "summary":
        job.summary = payload
    else:  # "usage" or "failed": the others would fail alike, or stop anyway
        job.error, job.usage_error = payload, kind == "usage"
        stop.request()


def _merged(jobs: list[_Job], kernel_name: str, device: str, preset, seed: int | None) -> dict:
    usage = [job.error for job in jobs if job.usage_error]
    if usage and not any((job.summary or job.snapshot or {}).get("cases") for job in jobs):
        raise JobError(f"{usage[0]} (reported by the --jobs worker processes)")
    summaries = [job.summary or _partial_summary(job, kernel_name, device, preset) for job in jobs]
    merged = merge_summaries(summaries, sources=[f"worker{job.index}" for job in jobs])
    for entry, job, summary in zip(merged["sources"], jobs, summaries):
        entry.update(gpu=job.gpu, stopped=summary["stopped"],
                     exit=None if job.summary else _exit_text(job.process.exitcode))
    merged.update(seed=seed, jobs=len(jobs))
    _add_new_counts(merged, summaries)
    return merged


def _partial_summary(job: _Job, kernel_name: str, device: str, preset) -> dict:
    """A summary for a worker that ended without one: its last snapshot, and every finding it reported."""
    from .campaign import CampaignResult

    base = job.snapshot or CampaignResult(verdict="", kernel=kernel_name, device=str(device), preset=preset.name,
                                          seed=job.seed, isolation="worker").as_dict()
    how = "failed (" + job.error.strip().splitlines()[-1] + ")" if job.error else \
        f"ended ({_exit_text(job.process.exitcode)})"
    note = (f"worker {job.index} {how} without a summary: its counts are those of its last progress report "
            f"({base['cases']} cases), its findings the {len(job.findings)} it reported")
    summary = {**base, "findings": list(job.findings), "stopped": "worker_failed" if job.error else "worker_died",
               "notes": list(base.get("notes") or []) + [note], "case_log": None, "case_log_sha256": None}
    summary["verdict"] = merged_verdict([summary])
    return summary


def _add_new_counts(merged: dict, summaries: list[dict]) -> None:
    # merge_summaries predates these two keys; setdefault leaves its own sums once it has them.
    from .campaign import count_skip_reasons

    reasons: Counter = Counter()
    for s in summaries:
        count_skip_reasons(reasons, s.get("skipped_reasons") or {})
    merged.setdefault("skipped_reasons", dict(reasons))
    merged.setdefault("compilations", sum(s.get("compilations") or 0 for s in summaries))


# ------------------------------------------------------------------------------------------------
# Self-test
# ------------------------------------------------------------------------------------------------


def _selftest_child(conn, index: int, options: dict) -> None:
    """A worker process: runs each row ``(variant, dtype)`` the parent sends, until it sends None."""
    _child_setup()
    from .selftest import run_selftest

    conn.send(("ready", None))
    while True:
        task = conn.recv()
        if task is None:
            return
        (variant, dtype), time_left = task
        rows = run_selftest(**options, names=[variant], dtypes=[dtype], time_budget=time_left)
        conn.send(("row", [row.as_dict() for row in rows]))


def run_selftest_rows(plan: list[tuple[str, str]], *, jobs: int, device: str, time_budget: float | None = None,
                      progress=None, **options) -> list:
    """The self-test's rows ``plan`` (``(variant, dtype)`` pairs, in order) run in ``jobs`` processes;
    ``options`` as for :func:`flashcheck.selftest.run_selftest`. Rows come back in the plan's order;
    ``progress(row)`` is called as each one finishes."""
    from .selftest import Row

    check_jobs(jobs, "jobs")
    deadline = None if time_budget is None else time.monotonic() + time_budget
    pending = list(enumerate(plan))
    done: dict = {}
    running = _start_jobs(_selftest_child, [dict(options, device=device)] * min(jobs, len(plan)), device,
                          "flashcheck-selftest")
    try:
        for job, kind, payload in _messages(running):
            for row in (Row.from_dict(d) for d in payload or []):
                done[plan.index((row.variant, row.dtype))] = row
                if progress is not None:
                    progress(row)
            if not pending:
                job.conn.send(None)
                continue
            index, row = pending.pop(0)
            time_left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
            job.conn.send((row, time_left))
    finally:
        _end_jobs(running)
    missing = [plan[i] for i in range(len(plan)) if i not in done]
    if missing:
        raise JobError(f"--jobs: the self-test's worker processes ended before these rows: {missing}")
    return [done[i] for i in range(len(plan))]
