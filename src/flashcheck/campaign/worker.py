"""Kernels run in a worker process, so that a campaign survives whatever the kernel does to its process.

A :class:`KernelWorker` is a ``multiprocessing`` "spawn" child that resolves the kernel by its name
(a built-in name or ``package.module:function``, never a pickled object) and runs
:func:`flashcheck.judge.check.check` on each case the parent sends. The parent turns what can go wrong with the
process into verdicts and goes on with a fresh worker:

- the process dies (segfault, ``os._exit``, a CUDA error that aborts) while the kernel runs: a ``crash``
  finding naming the exit code or the signal;
- the kernel hangs: the parent waits ``case_timeout`` seconds, kills the worker and reports a ``timeout``
  finding;
- the process dies or hangs while flashcheck's own code runs (drawing the case, judging it): flashcheck's
  failure, never the kernel's, so the case is a skip counted as such. The child shows its phase in a byte of
  shared memory (:mod:`flashcheck.judge.phases`), which the parent reads even after a SIGKILL
  (:mod:`.worker_deaths`);
- the kernel raises a CUDA error that poisons the process's CUDA context (an illegal memory access, a
  device-side assert): the worker reports the crash finding and then exits by itself, so that the next
  case runs in a fresh process instead of failing on a dead context;
- the process dies, hangs or fails while the defect models name a distinct bug on its saved case
  (:meth:`KernelWorker.explain`): no finding, the bug's explanation says why it has none.

Out-of-memory needs no process of its own: :func:`~flashcheck.judge.check.check` skips the case either way.

*Starting early.* Importing torch and flashcheck's checking code takes a worker seconds (about 3 s on a
GPU host). This module imports neither torch nor the case's code, so a process can start its
:class:`WorkerProcess` first thing, before it imports torch itself: the worker imports while the parent
imports and prepares its campaign, and waits for its kernel's name (:meth:`WorkerProcess.assign`, or
the :class:`KernelWorker` that takes it over). ``flashcheck fuzz`` does this, in each ``--jobs`` worker
too (:class:`flashcheck.campaign.config.CampaignHooks`'s ``worker_process``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import TYPE_CHECKING

from ..contract.counts import check_seconds
from ..errors import FlashcheckError, InvalidArgument
from ..judge.phases import Phase
from ..judge.verdict import BUG, SUSPICIOUS, Verdict
from .interrupts import sigint_ignored_by_children
from .messages import Assign, BuildCase, Built, Ended, ExplainCase, Explained, JudgeCase, JudgeFailed, JudgeRecipe
from .messages import Ready, Shutdown, TimedOut
from .transport import channel_pair
from .worker_child import poisons_cuda, worker_main
from .worker_deaths import death_verdict, exit_text, hang_verdict, phase_of

if TYPE_CHECKING:  # not at run time: flashcheck.inputs.case imports torch, and this module must not
    from ..inputs.case import AttentionCase

__all__ = ["ExplainFailed", "KernelWorker", "WorkerError", "WorkerProcess", "WorkerStartError", "default_case_timeout",
           "exit_text"]

# How long a worker may take to import torch, flashcheck and the kernel's module before it counts as broken.
START_TIMEOUT = 300.0
# How often the parent looks whether a worker it waits for is still alive.
_POLL_S = 0.25


def default_case_timeout(device) -> float:
    """Seconds one case may take: 300 on a GPU, 600 under the Triton interpreter (the CPU is ~100x slower)."""
    kind = getattr(device, "type", None) or str(device).split(":", 1)[0]  # a torch.device, or its name
    return 600.0 if kind == "cpu" else 300.0


class WorkerError(RuntimeError):
    """flashcheck itself failed inside the worker (not the kernel: what the kernel does is a finding)."""


class WorkerStartError(FlashcheckError, RuntimeError):
    """The worker could not resolve or load the kernel."""


class ExplainFailed(RuntimeError):
    """No explanation came back from the worker (it could not start, died, hung or failed): the bug stays found,
    unnamed."""


# ------------------------------------------------------------------------------------------------
# The parent
# ------------------------------------------------------------------------------------------------


class WorkerProcess:
    """A worker process started before its kernel is named: it imports torch and flashcheck's checking
    code at once, then waits for :meth:`assign` (or for the :class:`KernelWorker` that takes it over).

    Start it before this process imports torch (this module does not), and the two imports overlap.
    :meth:`assign` names the kernel as soon as it is known, so that the worker loads the kernel's module
    while this process goes on preparing. A worker process that is never taken over is ended by
    :meth:`close` (or leaving its ``with`` block); once a :class:`KernelWorker` has taken it, closing it
    does nothing and the :class:`KernelWorker` ends it.
    """

    def __init__(self):
        parent_end, child_end = channel_pair()
        context = multiprocessing.get_context("spawn")
        # Whose code the child runs (judge.phases): shared memory, which a SIGKILL leaves readable; no lock, one byte
        phase = context.Value("b", Phase.WAITING, lock=False)
        process = context.Process(target=worker_main, args=(child_end, phase), name="flashcheck-worker", daemon=True)
        with sigint_ignored_by_children():
            process.start()
        child_end.close()  # so that the parent sees EOF when the child dies
        self._process, self._channel, self._phase = process, parent_end, phase
        self.assignment: Assign | None = None

    @property
    def available(self) -> bool:
        """Still here to be assigned or taken over (not closed, not taken)."""
        return self._process is not None

    def assign(self, target: str, *, device: str, options: dict | None = None, paths: list | None = None) -> None:
        """Name the kernel the worker is to load (as :class:`KernelWorker` takes them); returns at once."""
        if self._process is None or self.assignment is not None:
            return
        self.assignment = Assign(target, str(device), dict(options or {}),
                                 tuple(paths) if paths is not None else (os.getcwd(),))
        try:
            self._channel.send(self.assignment)
        except OSError:
            pass  # it died: whoever waits for it finds out

    def take(self, assignment: Assign):
        """``(process, channel, phase)`` for a :class:`KernelWorker` of ``assignment``, assigned now unless it was
        before; None when it cannot take that one (closed, taken, or assigned another kernel)."""
        if self._process is None:
            return None
        if (self.assignment is not None and self.assignment != assignment) or \
                (self.assignment is None and not self._process.is_alive()):  # killed while it waited
            self.close()
            return None
        if self.assignment is None:
            self.assign(assignment.target, device=assignment.device, options=assignment.options,
                        paths=assignment.paths)
        taken, self._process, self._channel = (self._process, self._channel, self._phase), None, None
        return taken

    def close(self) -> None:
        """End it unless a :class:`KernelWorker` took it: it holds no case, so it is simply killed."""
        process, channel = self._process, self._channel
        self._process = self._channel = None
        if process is not None:
            if process.is_alive():
                process.kill()
            process.join(timeout=10.0)
        if channel is not None:
            channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class KernelWorker:
    """A worker process that checks cases for one kernel, restarted whenever it dies or hangs.

    ``target`` is the kernel's name (built-in or ``package.module:function``) and ``options`` the
    built-in's options: the worker resolves them itself. ``case_timeout`` (seconds, default
    :func:`default_case_timeout`) bounds one case, kernel runs, oracle and property reruns together.
    ``paths`` go in front of the worker's ``sys.path`` (the current directory by default), so that an
    import path that resolves here resolves there too. ``should_stop``, called while waiting, ends the
    wait with ``KeyboardInterrupt`` when it returns true: a signal handler only sets a flag, and the
    interruption surfaces here, at a safe point, rather than anywhere in the parent. ``process``, a
    :class:`WorkerProcess` started earlier, is taken over by the first :meth:`start` (unless it was
    assigned another kernel), which then waits only for what that process has left to do.
    """

    def __init__(self, target: str, *, device: str, options: dict | None = None, case_timeout: float | None = None,
                 paths: list | None = None, should_stop=None, process: WorkerProcess | None = None):
        if not isinstance(target, str):
            raise InvalidArgument("target", target, "a worker process resolves its kernel by name",
                                  "Pass a built-in name or 'package.module:function', or check a Kernel object "
                                  "in-process.")
        check_seconds("case_timeout", case_timeout, none_ok=True,
                      fix=f"Pass e.g. case_timeout={default_case_timeout(device):g}.")
        self.target = target
        self.device = str(device)
        self.options = dict(options or {})
        self.case_timeout = float(case_timeout) if case_timeout else default_case_timeout(device)
        self.paths = list(paths) if paths is not None else [os.getcwd()]
        self.should_stop = should_stop
        self._spare = process  # taken over by the first start
        self.starts = 0
        self.kernel_name: str | None = None
        self._process = None
        self._channel = None
        self._phase = None  # the worker's shared phase (judge.phases)
        self._busy = False

    @property
    def restarts(self) -> int:
        """Workers started after the first one (after a death, a hang or a poisoned CUDA context)."""
        return max(0, self.starts - 1)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def start(self) -> None:
        """Start a worker unless one is running; raises :class:`WorkerStartError` if it cannot load the kernel."""
        if self.alive:
            return
        self._discard()
        assignment = Assign(self.target, self.device, self.options, tuple(self.paths))
        spare, self._spare = self._spare, None
        taken = spare.take(assignment) if spare is not None else None
        if taken is None:
            taken = WorkerProcess().take(assignment)
        process, self._channel, self._phase = taken
        self._process = process
        self.starts += 1
        self._busy = True
        message = self._receive(max(START_TIMEOUT, self.case_timeout))
        self._busy = False
        match message:
            case Ready(kernel=name):
                self.kernel_name = name
                return
            case TimedOut():
                why = f"it did not report ready within {max(START_TIMEOUT, self.case_timeout):g} s"
            case Ended():
                process.join(timeout=5.0)
                why = f"it died while loading the kernel ({exit_text(process.exitcode)})"
            case _:  # LoadFailed
                why = message.error
        self._discard()
        raise WorkerStartError(f"kernel={self.target!r}: the worker process could not load it: {why}. "
                               "Check that the name resolves (flashcheck kernels; an import path must be importable "
                               "from the current directory), or run in-process with --no-isolation to debug.")

    def check(self, case: AttentionCase, *, properties=()) -> Verdict:
        """The verdict on ``case``, or a crash / timeout verdict when the worker died or hung on it."""
        regime = case.provenance.get("strategy") if case.provenance else None
        return self._judge(JudgeCase(case, tuple(properties)), regime, case.describe())[0]

    def check_recipe(self, recipe, *, properties=(), backward: bool = False, anchors: bool = False) -> tuple:
        """``(verdict, case)`` for the case the worker draws from ``recipe`` (on its GPU if it has one, so
        that no tensor crosses the pipe): ``case`` is the case when it failed (BUG or SUSPICIOUS), else
        None. A worker that died or hung in the kernel leaves a fresh one to draw the case again, to be saved
        (:class:`WorkerStartError` if that fresh one cannot).
        ``anchors``: the field's rules judge the same output too (``verdict.anchors``)."""
        verdict, case = self._judge(JudgeRecipe(recipe, tuple(properties), backward, anchors), recipe.regime,
                                    f"{recipe.dtype} {recipe.shapes} regime={recipe.regime}")
        if case is None and verdict.status in (BUG, SUSPICIOUS):  # a skip (flashcheck's failure) is neither
            case = self.build(recipe, backward=backward)
            verdict.case = case.describe()
        return verdict, case

    def build(self, recipe, *, backward: bool = False) -> AttentionCase:
        """The case of ``recipe`` as the worker draws it; :class:`WorkerStartError` if it cannot."""
        self.start()
        reply = self._ask(BuildCase(recipe, backward))
        if isinstance(reply, Built):
            return reply.case
        # flashcheck's drawing died: never the kernel's verdict, whatever the first death was
        raise WorkerStartError(f"a fresh worker could not draw the case of seed {recipe.seed} ({recipe.regime}) "
                               f"again to save it: it {reply}")

    def explain(self, case: AttentionCase) -> dict:
        """The defect models' explanation of ``case`` (``Explanation.as_dict()``), the kernel run in the worker;
        :class:`ExplainFailed` saying why when no worker could start, or it died, hung or failed meanwhile (the
        next case starts a fresh one)."""
        try:
            self.start()
        except WorkerStartError as exc:
            raise ExplainFailed(f"no worker process could start ({exc})") from None
        reply = self._ask(ExplainCase(case))
        if isinstance(reply, Explained):
            return reply.explanation
        raise ExplainFailed(f"the worker process {reply}")

    def _ask(self, message: BuildCase | ExplainCase):
        """The started worker's answer to ``message``, or why none came (a str: "died ...", "timed out ...",
        "failed: " and flashcheck's error there), the worker then discarded."""
        self._busy = True
        try:
            self._channel.send(message)
            reply = self._receive(self.case_timeout)
        except OSError:
            reply = Ended()
        self._busy = False
        match reply:
            case Ended():
                exitcode, phase = self._ended()
                why = f"died ({exit_text(exitcode)}), {phase.text}"
            case TimedOut():
                why = f"timed out {phase_of(self._phase).text}"
            case JudgeFailed(error=error):
                why = f"failed: {error}"
            case _:
                return reply
        self._discard()
        return why

    def _judge(self, message: JudgeCase | JudgeRecipe, regime: str | None, described: str) -> tuple:
        self.start()
        started = time.monotonic()
        self._busy = True  # until the answer is in: an interrupted wait leaves the worker mid-case
        try:
            self._channel.send(message)
        except OSError:  # a broken pipe: it died before reading the case
            self._busy = False
            return self._died(regime, described, time.monotonic() - started), None
        reply = self._receive(self.case_timeout)
        self._busy = False
        waited = time.monotonic() - started
        match reply:
            case TimedOut():
                return self._timed_out(regime, described, waited), None
            case Ended():
                return self._died(regime, described, waited), None
            case JudgeFailed(error=error, traceback=trace):
                raise WorkerError(f"flashcheck failed in the worker on {described}: {error}\n{trace}")
        verdict = Verdict.from_dict(reply.verdict)
        # The pipe both ways (a case past 2^31 elements is 8 GiB of it) and the worker's untimed steps.
        timed = sum(s for part, s in verdict.elapsed.items() if part not in ("compile", "transfer"))
        verdict.elapsed["transfer"] = max(0.0, waited - timed)
        if poisons_cuda(verdict):
            self._discard(wait=True)  # it exits by itself; the next case starts a fresh one
        return verdict, reply.case

    def close(self) -> None:
        """Stop the worker: politely if it is idle, by force if it is busy or does not go."""
        if self._spare is not None:  # never started
            self._spare.close()
            self._spare = None
        if self._busy:
            self._busy = False
            self._discard()
            return
        if self._channel is not None and self.alive:
            try:
                self._channel.send(Shutdown())
            except OSError:
                pass
        self._discard(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals --------------------------------------------------------------------------------

    def _receive(self, timeout: float):
        """The next message: :class:`Ended` when the worker's end of the pipe closed, :class:`TimedOut`
        when ``timeout`` passed first."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return TimedOut()
            if self.should_stop is not None and self.should_stop():
                raise KeyboardInterrupt  # close() then kills the busy worker
            try:
                if self._channel.poll(min(left, _POLL_S)):
                    return self._channel.receive()
            except (EOFError, OSError):
                return Ended()  # the pipe closed: the process is exiting (maybe not yet reaped)
            if not self._process.is_alive() and not self._channel.poll(0):
                return Ended()

    def _discard(self, *, wait: bool = False) -> None:
        process, channel = self._process, self._channel
        self._process = self._channel = self._phase = None
        if process is not None:
            if wait:
                process.join(timeout=2.0)
            if process.is_alive():
                process.kill()
            process.join(timeout=10.0)
        if channel is not None:
            channel.close()

    def _meta(self, regime: str | None, described: str) -> dict:
        return dict(kernel=self.kernel_name or self.target, case=described, regime=regime)

    def _died(self, regime: str | None, described: str, waited: float) -> Verdict:
        """The kernel's crash if it died in the kernel, else a skip as flashcheck's (:mod:`.worker_deaths`)."""
        exitcode, phase = self._ended()
        return death_verdict(phase, exitcode, waited, self._meta(regime, described))

    def _timed_out(self, regime: str | None, described: str, waited: float) -> Verdict:
        phase = phase_of(self._phase)  # before the kill: where it hung
        self._discard()
        return hang_verdict(phase, self.case_timeout, waited, self._meta(regime, described))

    def _ended(self) -> tuple:
        """``(exit code, phase)`` of a worker that died, once reaped (its last phase written); it is discarded."""
        process = self._process
        if process is not None:
            process.join(timeout=5.0)
        exitcode, phase = (process.exitcode if process is not None else None), phase_of(self._phase)
        self._discard()
        return exitcode, phase
