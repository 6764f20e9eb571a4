"""Kernels whose worker process dies or hangs in flashcheck's own code, not in the kernel: importable as
tests.robustness._dying_flashcheck:NAME.

Importing this module in a kernel's worker process (and only there: the parent that resolves the kernel too,
the test session itself, is left alone) wraps two of flashcheck's own steps, drawing a case
(``Recipe.build``) and the end of judging it (``record_compilations``, after the kernel's calls), so that
on a case with more than ``BIG`` query rows they do to the process what a host out of memory does: the
kernel's name says which step and how. The kernels themselves are correct, except ``segfaults``, which dies
in the kernel as tests.robustness._kernels:segfaults does.
"""

import multiprocessing
import os
import signal
import time

import flashcheck
import flashcheck.judge.check as judge_check
from flashcheck.inputs.recipe import Recipe

from ._kernels import BIG, SPEC, correct

__all__ = ["dies_drawing", "dies_judging", "hangs_drawing", "segfaults"]

MODULE = __name__
_last_shapes = {}  # the last case the kernel ran on: judging dies only on a big one
_drawn = []  # the cases this process drew, by number of query rows


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # what the host's out-of-memory killer sends


def _misbehave(kernel: str | None, step: str, n_q: int) -> None:
    """Do what ``kernel``'s name says at ``step`` ("drawing" or "judging") on a case of ``n_q`` query rows."""
    name = (kernel or "").rsplit(":", 1)[-1]
    if n_q <= BIG:
        return
    if name == f"dies_{step}":
        _die()
    if name == f"hangs_{step}":
        while True:
            time.sleep(1)
    # The kernel died on this case in another worker: this fresh one dies drawing it again to save it.
    if name == "segfaults" and step == "drawing" and not _drawn:
        _die()


def _install() -> None:
    build, record = Recipe.build, judge_check.record_compilations

    def dying_build(self, *, kernel=None, draw_on=None):
        _misbehave(kernel, "drawing", self.shapes.n_q)
        _drawn.append(self.shapes.n_q)
        return build(self, kernel=kernel, draw_on=draw_on)

    def dying_record(verdict, before):
        _misbehave(verdict.kernel, "judging", _last_shapes.get("n_q", 0))
        return record(verdict, before)

    Recipe.build = dying_build
    judge_check.record_compilations = dying_record


if multiprocessing.current_process().name == "flashcheck-worker":
    _install()


def _correct(q, k, v, *, scale, causal, attn_mask=None):
    _last_shapes["n_q"] = q.shape[2]
    return correct.fn(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


dies_drawing = flashcheck.kernel(_correct, name=f"{MODULE}:dies_drawing", **SPEC)
dies_judging = flashcheck.kernel(_correct, name=f"{MODULE}:dies_judging", **SPEC)
hangs_drawing = flashcheck.kernel(_correct, name=f"{MODULE}:hangs_drawing", **SPEC)


@flashcheck.kernel(**SPEC)
def segfaults(q, k, v, *, scale, causal, attn_mask=None):
    """Dies of SIGSEGV on big cases, in the kernel."""
    if q.shape[2] > BIG:
        os.kill(os.getpid(), signal.SIGSEGV)
    return _correct(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
