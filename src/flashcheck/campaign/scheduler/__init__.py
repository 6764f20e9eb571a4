"""Work spread over worker processes: a transport that runs the workers, a policy that decides what each
does, and the loop between them (as pytest-xdist splits its ``dsession``, ``workermanage`` and
``scheduler/``).

- A :class:`Transport` starts workers, sends them messages, yields what they send as ``(worker, message)``
  (messages of :mod:`flashcheck.campaign.messages`, dispatched by type), replaces one that ended where it can,
  and stops them: :class:`flashcheck.campaign.transport.ProcessTransport` ("spawn" children on this host) and
  :class:`flashcheck.campaign.ray_transport.RayTransport` (actors on a Ray cluster's nodes).
- A :class:`Policy` names what each worker starts with, the function it runs, and what to do with each
  message: :mod:`.seeds` (``fuzz --jobs``: one campaign's cases shared out by seed) and :mod:`.parts`
  (``selftest --jobs``: the rows' cases handed out in parts).
- :func:`run_workers` is the loop.

Another distributed backend plugs in as one more transport (and, if it shares work otherwise, one more
policy); the campaign and the self-test do not change.
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol

from ...contract.counts import check_count
from ...errors import FlashcheckError
from ..messages import Message
from ..transport import Worker

__all__ = ["JobError", "Policy", "Transport", "check_jobs", "run_workers"]


class JobError(FlashcheckError, RuntimeError):
    """A worker process could not run its part (the same usage error in every worker, as a rule)."""


def check_jobs(jobs, option: str = "--jobs") -> int:
    """``jobs`` if it is a whole number >= 1, else :class:`InvalidArgument` naming ``option``."""
    return check_count(option, jobs, what="a number of worker processes",
                       fix=f"Pass e.g. {option} 4 (several per GPU are fine), or leave it out for one process.")


class Transport(Protocol):
    """Starts workers and carries their messages."""

    replaces: bool  # whether :meth:`replace` can start a worker in place of one that ended

    def start(self, child: Callable, payloads: list, name: str) -> list[Worker]:
        """One worker per payload, running ``child(channel, index, payload)``."""

    def send(self, worker: Worker, message: Message) -> None:
        """``message`` to ``worker``'s channel; OSError or ValueError where it is gone, or nothing (its end comes)."""

    def replace(self, worker: Worker, payload) -> Worker | None:
        """A worker of ``worker``'s index running ``payload`` in place of ``worker``, which ended; its messages and
        end then come from :meth:`events` too. None where none could start."""

    def events(self, on_tick: Callable[[], None] | None = None) -> Iterator[tuple[Worker, Message]]:
        """What the workers send, then an :class:`~flashcheck.campaign.messages.Ended` for each."""

    def alive(self, worker: Worker) -> bool: ...

    def exitcode(self, worker: Worker) -> int | None: ...

    def how_ended(self, worker: Worker) -> str:
        """Its exit status in words, or what took it (its node lost)."""

    def terminate(self, worker: Worker) -> None:
        """Ask the worker to stop at a safe point."""

    def kill(self, worker: Worker) -> None: ...

    def end(self) -> None:
        """Every worker ended, its channel closed."""


class Policy(Protocol):
    """What the workers do, and what the parent does with what they send."""

    name: str  # the workers' process names start with it
    # A worker's whole life, ``child(channel, index, payload)``: a module-level function (a staticmethod
    # of the policy), which a spawned child imports by its name.
    child: Callable

    def payloads(self) -> list:
        """One start payload per worker (a typed, picklable record)."""

    def started(self, workers: list[Worker], transport: Transport) -> None: ...

    def handle(self, worker: Worker, message: Message) -> None:
        """One message, by its type."""

    def tick(self) -> None:
        """Called while waiting, at least every quarter second."""


def run_workers(policy: Policy, transport: Transport, meanwhile: Callable[[], None] | None = None) -> None:
    """Start the policy's workers, run ``meanwhile()`` while they import (if it raises, the workers are
    killed at once and the exception goes on), then hand the policy every message until all have ended."""
    workers = transport.start(policy.child, policy.payloads(), policy.name)
    policy.started(workers, transport)
    try:
        if meanwhile is not None:
            try:
                meanwhile()
            except BaseException:  # a usage error: the same in every worker, which need not get that far
                for worker in workers:
                    transport.kill(worker)
                raise
        for worker, message in transport.events(policy.tick):
            policy.handle(worker, message)
    finally:
        transport.end()
