"""The kernel worker process's side: import torch and the checks at once, load the kernel it is told,
judge each case it is sent and send back the verdict; leave at once when a kernel broke the process's CUDA
context, so that the next case runs in a fresh process. The parent's side is :mod:`.worker`."""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
import time
import traceback
import warnings
from typing import TYPE_CHECKING

from ..judge.phases import Phase, enter, show_phases
from ..judge.verdict import BUG, SUSPICIOUS, Finding, Verdict
from .messages import (
    Assign,
    BuildCase,
    Built,
    ExplainCase,
    Explained,
    JudgeCase,
    Judged,
    JudgeFailed,
    JudgeRecipe,
    LoadFailed,
    Ready,
    Shutdown,
)

if TYPE_CHECKING:  # not at run time: flashcheck.inputs.case imports torch, and this module must not
    from ..inputs.case import AttentionCase

__all__ = ["POISON_MARKERS", "die_with_parent", "drawn_case", "drawn_or_skipped", "poisons_cuda", "quiet_interpreter",
           "worker_main"]

# Error texts after which the CUDA context of the process is unusable: every later CUDA call fails too.
POISON_MARKERS = ("CUDA error", "illegal memory access", "device-side assert")

def poisons_cuda(verdict: Verdict) -> bool:
    """Whether a crash in ``verdict`` left the process's CUDA context unusable (so the worker must go)."""
    for f in verdict.findings:
        if f.kind == "crash":
            text = f.diagnosis + "\n" + str((f.details or {}).get("traceback") or "")
            if any(marker in text for marker in POISON_MARKERS):
                return True
    return False


def quiet_interpreter() -> None:
    """The Triton interpreter runs kernels through numpy, which warns on every inf and NaN a kernel
    makes (masked scores are -inf by design); those warnings say nothing about the kernel."""
    warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.")


def die_with_parent() -> None:
    # A hung kernel must not outlive a parent killed with SIGKILL (Linux only; elsewhere the parent's
    # exit closes the pipe, which ends an idle worker).
    if sys.platform.startswith("linux"):
        try:
            import ctypes  # Linux only

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def leave_terminal_group() -> None:
    """A process group of its own, so that Ctrl-C at the terminal (and ``timeout``'s signal to its group) does not
    reach the compilers the kernel runs: ptxas handles SIGINT itself, dies mid-compile and Triton prints its whole
    input. The parent stops this process; it dies with the parent (:func:`die_with_parent`)."""
    try:
        os.setpgid(0, 0)
    except (AttributeError, OSError):  # not POSIX, or already a group leader
        pass


def worker_main(channel, phase=None) -> None:
    """The worker's main loop: import, receive the kernel to load and load it, then judge each case
    received until told to stop. ``phase``: shared memory the parent reads whose code runs
    (:mod:`flashcheck.judge.phases`), so that a death in flashcheck's own code is never the kernel's."""
    # Ctrl-C reaches the whole process group; the parent decides what happens to a running case.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    leave_terminal_group()
    die_with_parent()
    show_phases(phase)
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid != os.getppid():
        return  # the parent died before that: nobody will name a kernel (a usage error, Ctrl-C)
    quiet_interpreter()
    try:  # the slow part (torch): done while the parent still prepares, before the kernel is named
        from ..judge.backward import judge_case
        from ..kernels.registry import resolve_kernel
        from .setup import warm_oracle
    except Exception as exc:
        failed = LoadFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc())
    else:
        failed = None
    try:
        assignment = channel.receive()
    except (EOFError, OSError):
        return  # the parent is gone, or closed a process it did not need
    if not isinstance(assignment, Assign):  # Shutdown
        return
    if failed is not None:  # reported in answer to the assignment: the parent reads it as its start's failure
        channel.send(failed)
        return
    for path in reversed(assignment.paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    warm_oracle(assignment.device)  # in the background, while the kernel loads
    try:
        kernel = resolve_kernel(assignment.target, device=assignment.device, **assignment.options)
    except Exception as exc:
        channel.send(LoadFailed(f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        return
    channel.send(Ready(os.getpid(), kernel.name))
    _judge_until_shutdown(channel, kernel, assignment.device, judge_case)


def _judge_until_shutdown(channel, kernel, device: str, judge_case) -> None:
    while True:
        try:
            message = channel.receive()
        except (EOFError, OSError):
            return  # the parent is gone
        if isinstance(message, Shutdown):
            return
        reply, poisoned = _answer(kernel, device, message, judge_case)
        channel.send(reply)
        enter(Phase.WAITING)  # only once the answer is out: a death while sending it is flashcheck's
        if poisoned:
            channel.close()
            os._exit(0)


def _answer(kernel, device: str, message: JudgeCase | JudgeRecipe | BuildCase | ExplainCase, judge_case) -> tuple:
    """The reply to one message, and whether the kernel broke the process's CUDA context (the worker then
    goes). A :class:`JudgeCase` or a :class:`JudgeRecipe` gets :class:`Judged` (with the case drawn here
    when a recipe's case failed), a :class:`BuildCase` :class:`Built`, an :class:`ExplainCase`
    :class:`Explained`; :class:`JudgeFailed` when flashcheck itself raised."""
    if isinstance(message, ExplainCase):
        return _explained(kernel, device, message.case)
    case = None
    try:
        draws = isinstance(message, (JudgeRecipe, BuildCase))
        enter(Phase.DRAWING if draws else Phase.JUDGING)  # the kernel's calls mark themselves (judge.phases)
        if isinstance(message, BuildCase):
            return Built(drawn_case(message.recipe, kernel=kernel.name, device=device,
                                    backward=message.backward)), False
        start = time.perf_counter()
        case, skipped = drawn_or_skipped(message.recipe, kernel=kernel.name, device=device,
                                         backward=message.backward) if draws else (message.case, None)
        drawn = time.perf_counter() - start if draws else 0.0
        enter(Phase.JUDGING)
        verdict = skipped or judge_case(kernel, case, device=device, properties=message.properties,
                                        anchors=draws and message.anchors)
        verdict.elapsed["generation"] = drawn
    except Exception as exc:
        text = f"{type(exc).__name__}: {exc}"
        if case is None or not any(marker in text for marker in POISON_MARKERS):
            return JudgeFailed(text, traceback.format_exc()), False
        # A CUDA error is sticky and may surface at a later call than the kernel's own (here in
        # flashcheck's code after the kernel ran): the kernel broke the context, so it is its crash.
        verdict = _poisoned_verdict(kernel.name, case, text, traceback.format_exc())
    failed = draws and verdict.status in (BUG, SUSPICIOUS)
    return Judged(verdict.as_dict(), case if failed else None), poisons_cuda(verdict)


def _explained(kernel, device: str, case) -> tuple:
    """:class:`Explained` with the models' explanation of ``case`` (flashcheck's own failure there is its note), and
    whether that failure says the kernel broke the CUDA context (the worker then goes)."""
    from ..defects.naming import explained  # torch: this module is imported by the parent's worker.py

    enter(Phase.JUDGING)  # the kernel's calls mark themselves (judge.phases)
    explanation = explained(kernel, case, device=device)
    return Explained(explanation.as_dict()), any(marker in (explanation.note or "") for marker in POISON_MARKERS)


def drawn_case(recipe, *, kernel: str, device, backward: bool, draw_on: str | None = None):
    """The case a campaign draws from ``recipe``: on its GPU if it checks on one (``draw_on``: there instead),
    its backward case with ``backward`` (the worker's and an in-process campaign's draw, the same numbers on
    one device)."""
    # torch: this module is imported by the parent's worker.py, which must not import it
    from ..inputs.drawing import draw_device
    from ..judge.backward import drawn_backward_case

    case = recipe.build(kernel=kernel, draw_on=draw_device(device) if draw_on is None else draw_on)
    return drawn_backward_case(case, recipe.seed) if backward else case


def drawn_or_skipped(recipe, *, kernel: str, device, backward: bool) -> tuple:
    """``(case, None)``: :func:`drawn_case`; a case too large to draw on its GPU beside what else holds that
    GPU's memory (other campaign processes, a large case's float32 values before rounding) drawn on the host
    instead, as a CPU campaign draws it, and judged on the GPU as before; or ``(None, verdict)``, an ``oom``
    skip, when the host cannot draw it either."""
    # torch: this module is imported by the parent's worker.py, which must not import it
    import torch
    from ..inputs.sizes import host_memory_problem
    from ..judge.skips import Skip, one_line, out_of_memory, skipped_verdict

    try:
        return drawn_case(recipe, kernel=kernel, device=device, backward=backward), None
    except RuntimeError as exc:
        if not out_of_memory(exc):
            raise
        torch.cuda.empty_cache()
        problem = one_line(exc, "drawing the case on the GPU")
    on_host = host_memory_problem(recipe.shapes)
    if on_host is None:
        return drawn_case(recipe, kernel=kernel, device=device, backward=backward, draw_on="cpu"), None
    meta = dict(kernel=kernel, case=f"{recipe.dtype} {recipe.shapes}", regime=recipe.regime)
    return None, skipped_verdict(Skip("oom", f"{problem}; on the host: {on_host}"), torch.device(device), meta)


def _poisoned_verdict(kernel_name: str, case: AttentionCase, text: str, trace: str) -> Verdict:
    regime = case.provenance.get("strategy") if case.provenance else None
    crash = Finding("crash", BUG, f"the CUDA context broke while this case ran ({text.splitlines()[0][:200]}); "
                    "flashcheck's next CUDA call reported it, so the kernel's launch is the likely cause",
                    regime=regime, details={"traceback": trace})
    return Verdict.from_findings([crash], max_ratio=math.nan, kernel=kernel_name, case=case.describe(), regime=regime)


