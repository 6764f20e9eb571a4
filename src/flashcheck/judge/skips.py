"""Cases that cannot be judged: the kernel declined the input (:class:`~flashcheck.errors.Unsupported`) or it did
not fit in device memory. Neither is a defect of the kernel, so such a case is skipped, not failed, whichever
call met it (the first, another split count, a property's rerun) and whatever the form of the kernel.
"""

from __future__ import annotations

import math

import torch

from ..errors import Unsupported
from .verdict import Verdict

__all__ = ["Skip", "one_line", "out_of_memory", "raise_skip", "skipped_verdict"]


def one_line(error: BaseException, where: str | None = None) -> str:
    """``error`` (after ``where``, when given) on one line of at most 300 characters."""
    text = f"{type(error).__name__}: {error}"
    return (text if where is None else f"{where}: {text}").splitlines()[0][:300]


class Skip(Exception):
    """A run of the kernel cannot be judged: ``kind`` is ``"oom"`` (out of device memory) or ``"unsupported"``
    (the kernel raised :class:`Unsupported`); ``reason`` says why."""

    def __init__(self, kind: str, reason: str):
        super().__init__(f"{kind}: {reason}")
        self.kind = kind


def out_of_memory(error: BaseException | None) -> bool:
    """Whether ``error`` says the device ran out of memory: the caching allocator's OutOfMemoryError, or CUDA's own
    "out of memory" from outside it (a library's workspace, a context; measured: torch.AcceleratorError "CUDA error:
    out of memory" from a matmul on an H100 that other processes had filled)."""
    if isinstance(error, torch.cuda.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and "CUDA" in text and "out of memory" in text


def raise_skip(error: BaseException | None, what: str) -> None:
    """Raise :class:`Skip` when ``error``, what a call of the kernel (``what``: which call) raised, says the case
    cannot be judged; any other error is the caller's to judge (a crash)."""
    if out_of_memory(error):
        raise Skip("oom", one_line(error, what))
    if isinstance(error, Unsupported):
        raise Skip("unsupported", error.reason)


def skipped_verdict(skip: Skip, device: torch.device, meta: dict) -> Verdict:
    """The verdict on a skipped case (``"<kind>: <reason>"``, which campaigns count per kind); ``meta``: the
    verdict's kernel, case and regime."""
    if skip.kind == "oom" and device.type == "cuda":
        torch.cuda.empty_cache()  # so that the next case starts clean
    return Verdict.from_findings([], max_ratio=math.nan, skipped=str(skip), **meta)
