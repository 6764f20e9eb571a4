"""Every message that crosses a process boundary, one dataclass each, dispatched by type.

A :class:`~flashcheck.campaign.transport.Channel` carries nothing else (it refuses any other object), so
what a process may say to another is read here, in one place, with its fields named: no tuple read by
index, no kind spelled as a string. Three conversations use them:

- a campaign and its kernel's worker process (:mod:`.worker`, :mod:`.worker_child`): the parent names the
  kernel (:class:`Assign`), sends cases or recipes to judge, recipes to draw again and a distinct bug's case to
  name by the defect models (:class:`ExplainCase`), and ends it (:class:`Shutdown`); the child answers
  :class:`Ready` or :class:`LoadFailed`, then :class:`Judged`, :class:`Built`, :class:`Explained` or
  :class:`JudgeFailed`;
- ``fuzz --jobs`` (:mod:`.scheduler.seeds`): each worker reports :class:`FindingSaved` at once,
  :class:`Progress` now and then and :class:`Finished` at its end, or :class:`CampaignRefused` (a usage
  error) or :class:`CampaignCrashed`;
- ``selftest --jobs`` (:mod:`.scheduler.parts`): a worker says :class:`WorkerReady`, is sent
  :class:`PartTask` after :class:`PartTask` and answers each with :class:`PartDone`, until
  :class:`Shutdown`.

:class:`Ended` and :class:`TimedOut` are never sent: the receiving side makes them when a channel closed or
a wait ran out, so that they are dispatched like the rest. Messages are small (slots, no methods that pickle
state of their own); a verdict crosses as its ``as_dict()``, a case or a recipe as itself.

Nothing here imports torch: the types named in fields are read only by type checkers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not at run time: each pulls torch or hypothesis in, and messages must not
    from ..inputs.case import AttentionCase
    from ..inputs.strategies import Recipe
    from .summary import CampaignSummary

__all__ = ["Assign", "Built", "BuildCase", "CampaignCrashed", "CampaignRefused", "Ended", "ExplainCase", "Explained",
           "FindingSaved", "Finished", "JudgeCase", "JudgeFailed", "JudgeRecipe", "Judged", "LoadFailed", "Message",
           "PartDone", "PartTask", "Progress", "Ready", "Shutdown", "TimedOut", "WorkerReady"]


class Message:
    """What a :class:`~flashcheck.campaign.transport.Channel` carries: an instance of a class of this module."""

    __slots__ = ()


def _message(cls):
    return dataclass(frozen=True, slots=True)(cls)


# ---- any worker ---------------------------------------------------------------------------------------------

@_message
class Shutdown(Message):
    """Parent to worker: nothing more to do, end now."""


@_message
class Ended(Message):
    """Made by the receiving side: the other end's channel closed (it exited, or died)."""


@_message
class TimedOut(Message):
    """Made by the receiving side: no message came within the time it waited."""


# ---- a campaign and its kernel's worker process ----------------------------------------------------------------

@_message
class Assign(Message):
    """Parent to kernel worker: the kernel to load, by name (never a pickled object), with its built-in
    options; ``paths`` go in front of the worker's ``sys.path``."""

    target: str
    device: str
    options: dict
    paths: tuple


@_message
class Ready(Message):
    """Kernel worker to parent: the kernel is loaded."""

    pid: int
    kernel: str  # the kernel's display name


@_message
class LoadFailed(Message):
    """Kernel worker to parent: it could not import flashcheck's checks or load the kernel; it exits."""

    error: str
    traceback: str


@_message
class JudgeCase(Message):
    """Parent to kernel worker: judge this case with these exact properties."""

    case: AttentionCase
    properties: tuple


@_message
class JudgeRecipe(Message):
    """Parent to kernel worker: draw the case of ``recipe`` there (no tensor crosses) and judge it;
    ``anchors``: the field's rules judge the same output too."""

    recipe: Recipe
    properties: tuple
    backward: bool
    anchors: bool


@_message
class BuildCase(Message):
    """Parent to kernel worker: draw the case of ``recipe`` again, to be saved."""

    recipe: Recipe
    backward: bool


@_message
class Judged(Message):
    """Kernel worker to parent: the verdict (``Verdict.as_dict()``), and the case drawn from a recipe when it
    failed (BUG or SUSPICIOUS), else None."""

    verdict: dict
    case: AttentionCase | None


@_message
class Built(Message):
    """Kernel worker to parent: the case :class:`BuildCase` asked for."""

    case: AttentionCase


@_message
class ExplainCase(Message):
    """Parent to kernel worker: run the kernel on this case and match its output against the defect models."""

    case: AttentionCase


@_message
class Explained(Message):
    """Kernel worker to parent: the defect models' explanation (``Explanation.as_dict()``; a note where none ran)."""

    explanation: dict


@_message
class JudgeFailed(Message):
    """Kernel worker to parent: flashcheck itself raised (not the kernel: what the kernel does is a verdict)."""

    error: str
    traceback: str


# ---- fuzz --jobs -------------------------------------------------------------------------------------------

@_message
class FindingSaved(Message):
    """Campaign worker to parent: a finding's summary entry, sent once its case is in the corpus, and again (the same
    ``path``) once the defect models named its bug."""

    entry: dict


@_message
class Progress(Message):
    """Campaign worker to parent: its counts so far (a summary without the case log or the records)."""

    snapshot: CampaignSummary


@_message
class Finished(Message):
    """Campaign worker to parent: its campaign's summary; it exits next."""

    summary: CampaignSummary


@_message
class CampaignRefused(Message):
    """Campaign worker to parent: a usage error (the same in every worker, as a rule)."""

    error: str


@_message
class CampaignCrashed(Message):
    """Campaign worker to parent: flashcheck raised in the campaign; its traceback."""

    traceback: str


# ---- selftest --jobs -----------------------------------------------------------------------------------------

@_message
class WorkerReady(Message):
    """Self-test worker to parent: ready for a part."""


@_message
class PartTask(Message):
    """Parent to self-test worker: run cases ``[start, stop)`` of the row ``(subject, dtype)``; ``fired``:
    the detectors earlier parts of a planted bug's row flagged; ``time_left``: seconds to the deadline."""

    task_id: int
    subject: str
    dtype: str
    start: int
    stop: int
    fired: tuple
    time_left: float | None


@_message
class PartDone(Message):
    """Self-test worker to parent: the row of one part (``Row.as_dict()``)."""

    task_id: int
    row: dict[str, Any]
