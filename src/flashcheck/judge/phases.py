"""Whose code a process is running, flashcheck's own or the kernel's: what a campaign's worker process shows its
parent, so that a death or a hang there is the kernel's only when the kernel was running.

Every call of a kernel under test that flashcheck makes (:func:`~flashcheck.judge.check.run_kernel`,
:func:`~flashcheck.judge.backward.run_backward` with its autograd backward, :func:`~flashcheck.judge.serving.run_form`)
runs inside :func:`kernel_call`. A process that must tell the two apart (the kernel's worker,
:mod:`flashcheck.campaign.worker_child`) passes :func:`show_phases` a shared-memory value, and marks its own
phases with :func:`enter`; the parent reads that value once the worker died or hung. Shared memory, not a
message: what a process killed with SIGKILL wrote there is still there, and a write costs no system call.
Everywhere else (no value shown) :func:`kernel_call` does nothing.

Nothing here imports torch: the parent reads the phases before it imports anything heavy.
"""

from __future__ import annotations

import enum
from contextlib import contextmanager

__all__ = ["Phase", "enter", "kernel_call", "show_phases"]


class Phase(enum.IntEnum):
    """What a worker process is doing: one byte of shared memory."""

    WAITING = 0  # between cases: reading the next one, or sending the last answer back
    DRAWING = 1  # flashcheck draws the case of a recipe
    JUDGING = 2  # flashcheck judges it: the oracle, the budget, the comparisons, the properties' bookkeeping
    KERNEL = 3   # the kernel under test runs (its first call, a property's rerun, its backward)

    @property
    def text(self) -> str:
        """Where a worker was, for a skip's or a finding's reason ("... while flashcheck drew the case")."""
        return _TEXTS[self]


_TEXTS = {Phase.WAITING: "while its worker waited between cases", Phase.DRAWING: "while flashcheck drew the case",
          Phase.JUDGING: "while flashcheck judged the case (the oracle, the budget, the comparisons)",
          Phase.KERNEL: "while the kernel ran"}

_shown = None  # where the phase is written: anything with a ``value`` (a multiprocessing shared value)


def show_phases(value) -> None:
    """Write the phase to ``value`` (``value.value``, an int) from now on in this process; None: nowhere."""
    global _shown
    _shown = value


def enter(phase: Phase) -> None:
    """Mark ``phase`` as begun (nothing when no value is shown)."""
    if _shown is not None:
        _shown.value = int(phase)


@contextmanager
def kernel_call():
    """The kernel runs in this block; the phase before it is back after it, however the block ends."""
    shown = _shown
    if shown is None:
        yield
        return
    before, shown.value = shown.value, int(Phase.KERNEL)
    try:
        yield
    finally:
        shown.value = before
