"""What a kernel worker's death or hang on a case says, by whose code it was running then
(:class:`~flashcheck.judge.phases.Phase`, read from the memory it shares with its parent).

The kernel running (its first call, a property's rerun, its backward): the kernel's ``crash`` (naming the exit
code or the signal) or ``timeout``, a BUG, its case drawn again by a fresh worker to be saved. flashcheck's own
code running (drawing the case, judging it, between cases): flashcheck's failure, never the kernel's, so the
case is skipped, counted by kind (``worker_died``, ``worker_timed_out``) with the exit and the phase as its
reason, and nothing is saved; a host out of memory that kills the worker while it draws a large case is the
usual one. Either way the next case gets a fresh worker.

Nothing here imports torch (the parent's :mod:`.worker` must not).
"""

from __future__ import annotations

import math
import signal

from ..judge.phases import Phase
from ..judge.verdict import BUG, Finding, Verdict

__all__ = ["death_verdict", "exit_text", "hang_verdict", "phase_of"]

# Where a skip's time goes in a campaign's time split (the kernel's time is the kernel's either way).
_TIME_PART = {Phase.WAITING: "transfer", Phase.DRAWING: "generation", Phase.JUDGING: "oracle", Phase.KERNEL: "kernel"}


def exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit status yet"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            return f"killed by signal {-exitcode}"
        # nothing in flashcheck sends SIGKILL to a worker busy with a case; the kernel or the system did
        hint = ", maybe by the system's out-of-memory killer" if name == "SIGKILL" else ""
        return f"killed by signal {name}{hint}"
    return f"exit code {exitcode}"


def phase_of(shared) -> Phase:
    """The phase a worker's shared value holds; the kernel's when there is none or it is unknown, as a death
    was before workers showed their phase."""
    try:
        return Phase(shared.value)
    except (AttributeError, ValueError):
        return Phase.KERNEL


def death_verdict(phase: Phase, exitcode: int | None, waited: float, meta: dict) -> Verdict:
    """The verdict on a case whose worker died ``waited`` seconds into it, in ``phase``; ``meta``: the verdict's
    kernel, case and regime."""
    how = exit_text(exitcode)
    if phase is not Phase.KERNEL:
        return _flashcheck_skip("worker_died", f"{how}, {phase.text}", phase, waited, meta)
    return _kernel_verdict(Finding(
        "crash", BUG, f"the worker process running the kernel died ({how}) after {waited:.3g} s: a segfault, "
        "an abort or an exit inside the kernel", details={"exitcode": exitcode, "died": how}), waited, meta)


def hang_verdict(phase: Phase, case_timeout: float, waited: float, meta: dict) -> Verdict:
    """The verdict on a case whose worker gave no answer within ``case_timeout`` seconds and was killed."""
    if phase is not Phase.KERNEL:
        return _flashcheck_skip("worker_timed_out", f"no answer within the case timeout of {case_timeout:g} s "
                                f"(--case-timeout) {phase.text}; the worker was killed", phase, waited, meta)
    return _kernel_verdict(Finding(
        "timeout", BUG, f"no result within the case timeout of {case_timeout:g} s (--case-timeout): the kernel "
        "hangs or is far too slow; its worker process was killed", details={"case_timeout": case_timeout}),
        waited, meta)


def _kernel_verdict(finding: Finding, waited: float, meta: dict) -> Verdict:
    finding.regime = meta["regime"]
    return Verdict.from_findings([finding], max_ratio=math.nan, elapsed={"kernel": waited}, **meta)


def _flashcheck_skip(kind: str, what: str, phase: Phase, waited: float, meta: dict) -> Verdict:
    # No finding, no case to save: counted as a skip of its kind, the reason without the seconds, so that one
    # failure of flashcheck's on many cases is one reason counted many times.
    reason = f"{kind}: {what}: flashcheck's own code failed, not the kernel"
    return Verdict.from_findings([], max_ratio=math.nan, skipped=reason, elapsed={_TIME_PART[phase]: waited}, **meta)
