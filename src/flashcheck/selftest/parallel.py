"""``selftest --jobs N``: the self-test's rows (subject x dtype) in N processes.

:func:`run_selftest_rows` cuts each row's cases into parts (``selftest --chunk``,
:func:`flashcheck.selftest.rows.row_parts`) and hands them out with the parts policy
(:mod:`flashcheck.campaign.scheduler.parts`): part 0 of every row, then part 1 of every row, and so on,
each to the next free worker, so that long rows do not hold the others back and a deadline cuts every row
alike. A planted bug's row has a small first part and runs its next one only once the earlier ones are in
and not every detector has fired. A case depends on the seed, the row and its index alone, so the parts
combined (:func:`flashcheck.selftest.rows.combine_parts`) give the rows of one process, in the same order.
"""

from __future__ import annotations

import time

from ..campaign.messages import PartDone, PartTask, Shutdown, WorkerReady
from ..campaign.scheduler import check_jobs, run_workers
from ..campaign.scheduler.parts import PartScheduler
from ..campaign.ray_transport import make_transport
from ..campaign.transport import child_setup
from ..contract.counts import check_count
from .config import SelftestConfig
from .rows import DEFAULT_PART, Row, all_fired, combine_parts, fired_detectors, row_parts
from .run import RowRunner, selftest_plan
from .subjects import subjects

__all__ = ["SelftestParts", "run_selftest_rows"]


def _selftest_child(channel, index: int, config: SelftestConfig) -> None:
    """A worker process: runs each part of a row the parent sends, until it is told to stop."""
    child_setup()
    runner = RowRunner(config)
    channel.send(WorkerReady())
    while True:
        task = channel.receive()
        if isinstance(task, Shutdown):
            return
        assert isinstance(task, PartTask), task
        row = runner.run(task.subject, task.dtype, task.start, task.stop, fired=task.fired,
                         time_budget=task.time_left)
        channel.send(PartDone(task.task_id, row.as_dict()))


class SelftestParts(PartScheduler):
    """The parts policy with the self-test's rows and workers; each of ``jobs`` workers (at most one per
    part) starts with ``config``."""

    name = "flashcheck-selftest"
    child = staticmethod(_selftest_child)

    def __init__(self, plan: list, correct: dict, parts_of, deadline: float | None, progress=None, *,
                 config: SelftestConfig | None = None, jobs: int = 1):
        super().__init__(plan, correct, parts_of, deadline, progress)
        self.config, self.jobs = config, jobs

    def payloads(self) -> list[SelftestConfig]:
        return [self.config] * self.workers_wanted(self.jobs)

    def combine(self, results: list) -> Row:
        return combine_parts(results)

    def fired(self, row: Row) -> frozenset:
        return fired_detectors(row)

    def caught(self, row: Row) -> bool:
        return all_fired(row)

    def read_row(self, data: dict) -> Row:
        return Row.from_dict(data)


def run_selftest_rows(config: SelftestConfig, *, jobs: int, part_cases: int | None = None,
                      progress=None, cluster: str | None = None) -> list[Row]:
    """The self-test's rows (:func:`flashcheck.selftest.run.selftest_plan`) run in ``jobs`` processes, in
    parts of ``part_cases`` cases; the same rows, in the same order, as
    :func:`flashcheck.selftest.run.run_selftest` gives. ``progress(row)`` is called as each row completes.
    ``cluster``: a Ray address (:func:`~flashcheck.campaign.ray_transport.check_cluster`) whose nodes run the
    processes instead of this host."""
    check_jobs(jobs, "jobs")
    part_cases = DEFAULT_PART if part_cases is None else part_cases
    check_count("part_cases", part_cases, what="a number of cases",
                fix=f"Pass e.g. part_cases={DEFAULT_PART}, or leave it out for the default.")
    plan = selftest_plan(config)
    correct = {s.name: s.correct for s in subjects(config.device, names=sorted({name for name, _ in plan}),
                                                   backward=config.backward)}
    deadline = None if config.time_budget is None else time.monotonic() + config.time_budget
    policy = SelftestParts(plan, correct, lambda ok: row_parts(ok, config.cases, config.bug_cases, part_cases),
                           deadline, progress, config=config, jobs=jobs)
    run_workers(policy, make_transport(config.device, cluster))
    return policy.result()
