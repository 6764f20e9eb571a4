"""``fuzz --jobs N`` and ``selftest --jobs N``: one campaign, or one self-test, spread over N processes.

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

**Self-test.** :func:`run_selftest_rows` runs the self-test's rows (variant x dtype) in N processes, in
chunks of a row's cases (``selftest --chunk``, :func:`flashcheck.selftest.run.row_chunks`): chunk 0 of every
row, then chunk 1 of every row, and so on, each to the next free worker, so that long rows do not hold
the others back and a deadline cuts every row alike. A planted bug's row has a small first chunk and
runs its next one only once the earlier ones are in and not every detector has fired (the row ends where
one process would end it). A case depends on the seed, the row and its index alone, so the chunks merged
(:func:`flashcheck.selftest.run.merge_chunks`) give the rows of one process, returned in the same order.
"""

from __future__ import annotations

import hashlib
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import traceback
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from ..contract.counts import check_count
from ..errors import FlashcheckError, InvalidArgument
from .bugs import bugs_with_findings
from .interrupts import defer_terminate, sigint_ignored_by_children, take_pending
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
    return check_count(option, jobs, what="a number of worker processes",
                       fix=f"Pass e.g. {option} 4 (several per GPU are fine), or leave it out for one process.")


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


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def threads_per_worker(jobs: int) -> str:
    return str(max(1, usable_cores() // max(jobs, 1)))


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
            with sigint_ignored_by_children():
                process.start()
        child_end.close()  # so that the parent reads EOF once the child is gone
        jobs.append(_Job(index, process, parent_end, gpu, seed=payload.get("seed")))
    return jobs


def _messages(jobs: list[_Job], on_tick=None, ends: bool = False):
    """Every message of every job, as ``(job, kind, payload)``, until each job's pipe has closed
    (with ``ends``, that too: ``(job, "ended", None)``)."""
    open_conns = {job.conn: job for job in jobs}
    while open_conns:
        if on_tick is not None:
            on_tick()
        for conn in wait(list(open_conns), timeout=_POLL_S):
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):  # the worker has ended (what it sent before was read first)
                job = open_conns.pop(conn)
                if ends:
                    yield job, "ended", None
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
    shares = split_examples(max_examples or preset.max_examples, jobs)
    # Each worker checks the options again (prepare_campaign) and keeps the dtypes its kernel supports.
    options = [dict(kernel=kernel, device=device, preset=preset, dtypes=dtypes, max_examples=n, time_budget=time_budget,
                    seed=job_seed(seed, i, jobs), corpus=str(corpus), database=database, keep_going=keep_going,
                    case_timeout=case_timeout, kernel_options=kernel_options, reuse=seed is None,
                    started_at=started_at, backward=backward, records=records)
               for i, n in enumerate(shares) if n > 0]
    stop = _StopRequests([])
    with stop.installed():
        # The workers start first and import while this process resolves the kernel for its own checks.
        running = stop.jobs = _start_jobs(_campaign_child, options, device, "flashcheck-fuzz")
        try:
            from .setup import prepare_campaign

            resolved, _, _ = prepare_campaign(kernel, device=device, preset=preset, dtypes=dtypes, isolate=True,
                                              case_timeout=case_timeout, kernel_options=kernel_options,
                                              backward=backward)
        except BaseException:  # a usage error: the same in every worker, which need not get that far
            for job in running:
                job.process.kill()
            _end_jobs(running)
            raise
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
    from .result import CampaignResult

    base = job.snapshot or CampaignResult(verdict="", kernel=kernel_name, device=str(device), preset=preset.name,
                                          seed=job.seed, isolation="worker").as_dict()
    how = "failed (" + job.error.strip().splitlines()[-1] + ")" if job.error else \
        f"ended ({_exit_text(job.process.exitcode)})"
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


# ------------------------------------------------------------------------------------------------
# Self-test
# ------------------------------------------------------------------------------------------------


def _selftest_child(conn, index: int, options: dict) -> None:
    """A worker process: runs each chunk of a row the parent sends, until it sends None."""
    _child_setup()
    from ..selftest.run import RowRunner

    runner = RowRunner(**options)
    conn.send(("ready", None))
    while True:
        task = conn.recv()
        if task is None:
            return
        task_id, (variant, dtype), (start, stop), fired, time_left = task
        row = runner.run(variant, dtype, start, stop, fired=fired, time_budget=time_left)
        conn.send(("chunk", (task_id, row.as_dict())))


@dataclass
class _RowChunks:
    """The parent's account of one row of ``selftest --jobs``: its chunks, sent and received."""

    index: int                 # in the plan
    key: tuple                 # (variant, dtype)
    correct: bool
    chunks: list               # [start, stop) of each chunk, in order
    sent: int = 0              # chunks handed out so far (in order)
    in_flight: int = 0
    results: dict = field(default_factory=dict)  # chunk number -> Row
    caught: bool = False       # a planted bug's row: every detector fired, its later chunks are not needed
    lost: bool = False         # a worker died running one of its chunks
    row: object = None         # the merged row, once complete

    def available(self, past_deadline: bool) -> bool:
        """Whether its next chunk may go out now: a planted bug's only once its earlier ones are in (it
        runs on only while not caught); after the deadline only a row's first chunk (its first case)."""
        if self.caught or self.lost or self.row is not None or self.sent >= len(self.chunks):
            return False
        if past_deadline and self.sent > 0:
            return False
        return self.correct or self.in_flight == 0

    def prefix(self) -> list:
        out = []
        for number in range(len(self.chunks)):
            if number not in self.results:
                break
            out.append(self.results[number])
        return out


class _ChunkScheduler:
    """Hands out the chunks of every row round-robin (chunk 0 of each row in the plan's order, then
    chunk 1 of each, ...) to whichever worker is free, preferring a row the worker ran before (its
    kernel and cases are ready there); merges each row once its chunks are in."""

    def __init__(self, plan: list, correct: dict, chunks_of, deadline: float | None, progress=None):
        self.rows = [_RowChunks(i, key, correct[key[0]], chunks_of(correct[key[0]])) for i, key in enumerate(plan)]
        self.deadline, self.progress = deadline, progress
        self.idle: list = []          # workers waiting for a chunk
        self.tasks: dict = {}         # task id -> (job index, row, chunk number)
        self.seen: dict = {}          # job index -> rows it ran
        self.next_id = 0

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def received(self, job: _Job, task_id: int, row_dict: dict) -> None:
        from ..selftest.run import Row, all_fired, merge_chunks

        _, state, number = self.tasks.pop(task_id)
        state.in_flight -= 1
        state.results[number] = Row.from_dict(row_dict)
        if not state.correct:
            prefix = state.prefix()
            if prefix and all_fired(merge_chunks(prefix)):
                state.caught = True
        self.idle.append(job)

    def ended(self, job: _Job) -> None:
        """A worker's pipe closed: the chunk it was running (if any) will not come back."""
        for task_id, (index, state, _) in list(self.tasks.items()):
            if index == job.index:
                del self.tasks[task_id]
                state.in_flight -= 1
                state.lost = True
        self.idle = [j for j in self.idle if j is not job]

    def dispatch(self) -> None:
        past = self.past_deadline()
        while self.idle:
            ready = [s for s in self.rows if s.available(past)]
            if not ready:
                break
            job = self.idle.pop(0)
            first_round = min(s.sent for s in ready)
            ready = [s for s in ready if s.sent == first_round]
            seen = self.seen.setdefault(job.index, set())
            state = next((s for s in ready if s.index in seen), ready[0])
            number = state.sent
            time_left = None if self.deadline is None else max(self.deadline - time.monotonic(), 1e-3)
            fired = () if state.correct else sorted(self._fired_before(state))
            task_id, self.next_id = self.next_id, self.next_id + 1
            try:
                job.conn.send((task_id, state.key, state.chunks[number], fired, time_left))
            except (OSError, ValueError):  # the worker is gone; its pipe's end will say so
                continue
            self.tasks[task_id] = (job.index, state, number)
            state.sent += 1
            state.in_flight += 1
            seen.add(state.index)
        self._complete(past)
        if not self.tasks and not any(s.available(past) for s in self.rows):
            for job in self.idle:  # nothing left to run: the workers may end
                try:
                    job.conn.send(None)
                except (OSError, ValueError):
                    pass
            self.idle = []

    def _fired_before(self, state: _RowChunks) -> frozenset:
        from ..selftest.run import fired_detectors, merge_chunks

        prefix = state.prefix()
        return fired_detectors(merge_chunks(prefix)) if prefix else frozenset()

    def _complete(self, past: bool) -> None:
        """Merge every row with nothing in flight and nothing more to send, and report it."""
        from ..selftest.run import merge_chunks

        for state in self.rows:
            if state.row is not None or state.lost or state.in_flight or state.available(past) or not state.results:
                continue
            row = merge_chunks([state.results[n] for n in sorted(state.results)])
            # chunks never sent because the deadline came: the row stopped before its last case
            row.stopped = row.stopped or (not state.caught and len(state.results) < len(state.chunks))
            state.row = row
            if self.progress is not None:
                self.progress(row)


def run_selftest_rows(plan: list[tuple[str, str]], *, jobs: int, device: str, time_budget: float | None = None,
                      progress=None, chunk: int | None = None, **options) -> list:
    """The self-test's rows ``plan`` (``(variant, dtype)`` pairs, in order) run in ``jobs`` processes;
    ``options`` as for :func:`flashcheck.selftest.run.run_selftest`. Rows come back in the plan's order;
    ``progress(row)`` is called as each one completes.

    Each row's cases are cut into chunks of ``chunk`` cases (:func:`flashcheck.selftest.run.row_chunks`),
    handed out round-robin over the rows, so every worker stays busy and a deadline (``time_budget``)
    cuts every row alike; a planted bug's row runs its next chunk only while not every detector has
    fired. A case's result depends on the row and its index alone, so the rows are those of one process.
    """
    from ..selftest.run import DEFAULT_CHUNK, row_chunks, variants

    check_jobs(jobs, "jobs")
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    check_count("chunk", chunk, what="a number of cases", fix="Pass e.g. --chunk 50, or leave it out for the default.")
    cases, bug_cases = options.get("cases", 200), options.get("bug_cases", 60)
    correct = {v.name: v.correct for v in variants(device, names=sorted({name for name, _ in plan}),
                                                   backward=options.get("backward", False))}
    deadline = None if time_budget is None else time.monotonic() + time_budget
    scheduler = _ChunkScheduler(plan, correct, lambda ok: row_chunks(ok, cases, bug_cases, chunk), deadline,
                                progress)
    workers = min(jobs, sum(len(s.chunks) for s in scheduler.rows))
    running = _start_jobs(_selftest_child, [dict(options, device=device)] * workers, device, "flashcheck-selftest")
    try:
        for job, kind, payload in _messages(running, scheduler.dispatch, ends=True):
            if kind == "chunk":
                scheduler.received(job, *payload)
            elif kind == "ready":
                scheduler.idle.append(job)
            elif kind == "ended":
                scheduler.ended(job)
            scheduler.dispatch()
    finally:
        _end_jobs(running)
    missing = [s.key for s in scheduler.rows if s.row is None]
    if missing:
        raise JobError(f"--jobs: the self-test's worker processes ended before these rows: {missing}")
    return [s.row for s in scheduler.rows]
