"""``selftest --jobs N``: the self-test's rows (variant x dtype) in N processes.

**Self-test.** :func:`run_selftest_rows` runs the self-test's rows (variant x dtype) in N processes, in
chunks of a row's cases (``selftest --chunk``, :func:`flashcheck.selftest.run.row_chunks`): chunk 0 of every
row, then chunk 1 of every row, and so on, each to the next free worker, so that long rows do not hold
the others back and a deadline cuts every row alike. A planted bug's row has a small first chunk and
runs its next one only once the earlier ones are in and not every detector has fired (the row ends where
one process would end it). A case depends on the seed, the row and its index alone, so the chunks merged
(:func:`flashcheck.selftest.run.merge_chunks`) give the rows of one process, returned in the same order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..campaign.jobs import Job, JobError, check_jobs, child_setup, end_jobs, messages, start_jobs
from ..contract.counts import check_count

__all__ = ["ChunkScheduler", "run_selftest_rows"]


def _selftest_child(conn, index: int, options: dict) -> None:
    """A worker process: runs each chunk of a row the parent sends, until it sends None."""
    child_setup()
    from .run import RowRunner

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


class ChunkScheduler:
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

    def received(self, job: Job, task_id: int, row_dict: dict) -> None:
        from .run import Row, all_fired, merge_chunks

        _, state, number = self.tasks.pop(task_id)
        state.in_flight -= 1
        state.results[number] = Row.from_dict(row_dict)
        if not state.correct:
            prefix = state.prefix()
            if prefix and all_fired(merge_chunks(prefix)):
                state.caught = True
        self.idle.append(job)

    def ended(self, job: Job) -> None:
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
        from .run import fired_detectors, merge_chunks

        prefix = state.prefix()
        return fired_detectors(merge_chunks(prefix)) if prefix else frozenset()

    def _complete(self, past: bool) -> None:
        """Merge every row with nothing in flight and nothing more to send, and report it."""
        from .run import merge_chunks

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
    from .run import DEFAULT_CHUNK, row_chunks, variants

    check_jobs(jobs, "jobs")
    chunk = DEFAULT_CHUNK if chunk is None else chunk
    check_count("chunk", chunk, what="a number of cases", fix="Pass e.g. --chunk 50, or leave it out for the default.")
    cases, bug_cases = options.get("cases", 200), options.get("bug_cases", 60)
    correct = {v.name: v.correct for v in variants(device, names=sorted({name for name, _ in plan}),
                                                   backward=options.get("backward", False))}
    deadline = None if time_budget is None else time.monotonic() + time_budget
    scheduler = ChunkScheduler(plan, correct, lambda ok: row_chunks(ok, cases, bug_cases, chunk), deadline,
                                progress)
    workers = min(jobs, sum(len(s.chunks) for s in scheduler.rows))
    running = start_jobs(_selftest_child, [dict(options, device=device)] * workers, device, "flashcheck-selftest")
    try:
        for job, kind, payload in messages(running, scheduler.dispatch, ends=True):
            if kind == "chunk":
                scheduler.received(job, *payload)
            elif kind == "ready":
                scheduler.idle.append(job)
            elif kind == "ended":
                scheduler.ended(job)
            scheduler.dispatch()
    finally:
        end_jobs(running)
    missing = [s.key for s in scheduler.rows if s.row is None]
    if missing:
        raise JobError(f"--jobs: the self-test's worker processes ended before these rows: {missing}")
    return [s.row for s in scheduler.rows]
