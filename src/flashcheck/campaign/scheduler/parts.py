"""``selftest --jobs N``'s policy: rows of cases cut into parts, handed out round-robin to whichever worker
is free, and combined back into rows.

Part 0 of every row goes out first (in the plan's order), then part 1 of every row, and so on, so that long
rows do not hold the others back and a deadline cuts every row alike; a worker is given a row it ran before
when it can (its kernel and cases are ready there). A planted bug's row runs its next part only once the
earlier ones are in and not every detector has fired, so it ends where one process would end it. On a cluster a
part whose worker was lost goes out again, once, and a new worker takes the lost one's place.

The policy knows rows only as what :meth:`PartScheduler.combine`, :meth:`~PartScheduler.fired` and
:meth:`~PartScheduler.caught` say of them: the self-test (:mod:`flashcheck.selftest.parallel`) subclasses
it with its rows' rules and its worker's function.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..messages import Ended, PartDone, PartTask, Shutdown, WorkerReady
from ..transport import Worker
from . import JobError, Transport

__all__ = ["PartScheduler"]


@dataclass
class _RowParts:
    """The parent's account of one row: its parts, sent and received."""

    index: int                 # in the plan
    key: tuple                 # (subject, dtype)
    correct: bool
    parts: list                # [start, stop) of each part, in order
    sent: int = 0              # parts handed out so far (in order)
    again: list = field(default_factory=list)  # parts whose worker was lost, to hand out again (once each)
    retried: set = field(default_factory=set)
    in_flight: int = 0
    results: dict = field(default_factory=dict)  # part number -> its row
    caught: bool = False       # a planted bug's row: every detector fired, its later parts are not needed
    lost: bool = False         # a worker died running one of its parts
    row: object = None         # the combined row, once complete

    def available(self, past_deadline: bool) -> bool:
        """Whether its next part may go out now: a planted bug's only once its earlier ones are in (it
        runs on only while not caught); after the deadline only a row's first part (its first case)."""
        if self.caught or self.lost or self.row is not None:
            return False
        if self.again:  # begun before the deadline: its row needs it whole
            return self.correct or self.in_flight == 0
        if self.sent >= len(self.parts) or (past_deadline and self.sent > 0):
            return False
        return self.correct or self.in_flight == 0

    def prefix(self) -> list:
        out = []
        for number in range(len(self.parts)):
            if number not in self.results:
                break
            out.append(self.results[number])
        return out


class PartScheduler:
    """Hands out the parts of the rows of ``plan`` (``(subject, dtype)`` pairs; ``correct[subject]``: a
    correct kernel's row, else a planted bug's; ``parts_of(correct)``: its ``[start, stop)`` parts).
    ``deadline`` (``time.monotonic()``) stops all but a row's first part; ``progress(row)`` is called as
    each row completes. Subclasses name ``child`` and ``name`` and the rows' rules."""

    name: str
    child: Callable

    def __init__(self, plan: list, correct: dict, parts_of, deadline: float | None, progress=None):
        self.rows = [_RowParts(i, key, correct[key[0]], parts_of(correct[key[0]])) for i, key in enumerate(plan)]
        self.deadline, self.progress = deadline, progress
        self.idle: list[Worker] = []  # workers waiting for a part
        self.tasks: dict = {}         # task id -> (worker, row, part number)
        self.seen: dict = {}          # worker index -> rows it ran
        self.next_id = 0
        self.transport: Transport | None = None

    # ---- the rows' rules ------------------------------------------------------------------------------

    def combine(self, results: list):
        """One row from the rows of its parts."""
        raise NotImplementedError

    def fired(self, row) -> frozenset:
        """The detectors done with ``row``."""
        raise NotImplementedError

    def caught(self, row) -> bool:
        """Whether every detector is done with a planted bug's ``row``: its later parts are not needed."""
        raise NotImplementedError

    def read_row(self, data: dict):
        """A part's row from the dict a worker sent."""
        raise NotImplementedError

    def payloads(self) -> list:
        """What each worker starts with (a worker in a lost one's place too)."""
        raise NotImplementedError

    # ---- the policy ---------------------------------------------------------------------------------------

    def workers_wanted(self, jobs: int) -> int:
        return min(jobs, sum(len(s.parts) for s in self.rows))

    def started(self, workers: list[Worker], transport: Transport) -> None:
        self.transport = transport  # a worker asks for work once it is ready

    def handle(self, worker: Worker, message) -> None:
        match message:
            case WorkerReady():
                self.idle.append(worker)
            case PartDone(task_id=task_id, row=row):
                self.received(worker, task_id, row)
            case Ended():
                self.ended(worker)
        self.dispatch()

    def tick(self) -> None:
        self.dispatch()

    def past_deadline(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def received(self, worker: Worker, task_id: int, row: dict) -> None:
        _, state, number = self.tasks.pop(task_id)
        state.in_flight -= 1
        state.results[number] = self.read_row(row)
        if not state.correct:
            prefix = state.prefix()
            if prefix and self.caught(self.combine(prefix)):
                state.caught = True
        self.idle.append(worker)

    def ended(self, worker: Worker) -> None:
        """A worker's channel closed: the part it was running (if any) will not come back from it. Where the
        transport replaces workers (a cluster's: a node lost), the part goes out again, once, and a new worker
        takes the lost one's place; elsewhere, or lost twice, its row is lost."""
        again = self.transport is not None and self.transport.replaces
        for task_id, (owner, state, number) in list(self.tasks.items()):
            if owner is worker:
                del self.tasks[task_id]
                state.in_flight -= 1
                if again and number not in state.retried:
                    state.retried.add(number)
                    state.again.append(number)
                else:
                    state.lost = True
        self.idle = [w for w in self.idle if w is not worker]
        if again and (self.tasks or any(s.available(self.past_deadline()) for s in self.rows)):
            self.transport.replace(worker, self.payloads()[worker.index])  # it asks for a part once it is ready

    def dispatch(self) -> None:
        past = self.past_deadline()
        while self.idle:
            ready = [s for s in self.rows if s.available(past)]
            if not ready:
                break
            self._send_next(self.idle.pop(0), ready)  # a worker that is gone is not idle again
        self._complete(past)
        if not self.tasks and not any(s.available(past) for s in self.rows):
            for worker in self.idle:  # nothing left to run: the workers may end
                try:
                    self.transport.send(worker, Shutdown())
                except (OSError, ValueError):
                    pass
            self.idle = []

    def _send_next(self, worker: Worker, ready: list) -> bool:
        """Send ``worker`` a part lost with its worker, else the next part of a row in the earliest round, one it
        ran before if it can."""
        first_round = min(s.sent for s in ready)
        ready = [s for s in ready if s.again] or [s for s in ready if s.sent == first_round]
        seen = self.seen.setdefault(worker.index, set())
        state = next((s for s in ready if s.index in seen), ready[0])
        number = state.again[0] if state.again else state.sent
        start, stop = state.parts[number]
        time_left = None if self.deadline is None else max(self.deadline - time.monotonic(), 1e-3)
        fired = () if state.correct else tuple(sorted(self._fired_before(state)))
        task_id, self.next_id = self.next_id, self.next_id + 1
        try:
            self.transport.send(worker, PartTask(task_id, state.key[0], state.key[1], start, stop, fired, time_left))
        except (OSError, ValueError):  # the worker is gone; its channel's end will say so
            return False
        self.tasks[task_id] = (worker, state, number)
        if state.again:
            state.again.pop(0)
        else:
            state.sent += 1
        state.in_flight += 1
        seen.add(state.index)
        return True

    def _fired_before(self, state: _RowParts) -> frozenset:
        prefix = state.prefix()
        return self.fired(self.combine(prefix)) if prefix else frozenset()

    def _complete(self, past: bool) -> None:
        """Combine every row with nothing in flight and nothing more to send, and report it."""
        for state in self.rows:
            if state.row is not None or state.lost or state.in_flight or state.available(past) or not state.results:
                continue
            row = self.combine([state.results[n] for n in sorted(state.results)])
            # parts never sent because the deadline came: the row stopped before its last case
            row.stopped = row.stopped or (not state.caught and len(state.results) < len(state.parts))
            state.row = row
            if self.progress is not None:
                self.progress(row)

    def result(self) -> list:
        """The rows in the plan's order; :class:`JobError` when workers ended before some of them."""
        missing = [s.key for s in self.rows if s.row is None]
        if missing:
            raise JobError(f"--jobs: the self-test's worker processes ended before these rows: {missing}")
        return [s.row for s in self.rows]
