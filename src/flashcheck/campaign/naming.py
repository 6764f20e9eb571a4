"""Naming each distinct bug by the defect model its output shows (:mod:`flashcheck.defects`): once a bug, on its
last case, after that case is saved.

A bug's last case is its smallest, saved when its shrink ends (:meth:`BugNames.final`, from the campaign's
``record_shrunk``; a stored failure replayed as it was counts). A bug never shrunk (met while another bug shrank,
in a campaign that stops at its first) is named on its case as found when the campaign ends
(:meth:`BugNames.finish`), read back from the corpus. Only BUG verdicts whose findings are numerical are named
(:func:`~flashcheck.defects.naming.describes`).

Naming runs the kernel again where it runs (its worker process, if it has one) and costs up to seconds: it is never
on a case's path, and its time is the summary's ``models`` part. The explanation (``Explanation.as_dict()``) goes on
the finding's summary entry and on its bug (``"model"``; their titles name the model that explains it), into the
saved case's provenance, and to ``on_finding`` again. A worker that dies, hangs or fails while the models run, or
flashcheck raising there, leaves a note in its place: the finding stays saved, and is never the kernel's crash.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..defects.naming import describes, explained, not_run, too_large
from ..errors import FlashcheckError
from ..inputs.case import AttentionCase
from ..inputs.casefile import add_provenance
from ..judge.skips import one_line
from .causes import Cause
from .result import MODELS
from .worker import ExplainFailed

__all__ = ["BugNames"]

# Stops after which the bugs left unshrunk are not named: the user asked to stop, or no worker can run the kernel.
_NOT_NAMING = ("interrupted", "worker_failed")


@dataclass
class _Unnamed:
    """A bug's case as found, named at the campaign's end unless its shrink names the bug first; ``too_large``: why
    the models would not run on it (it is then not read back)."""

    cause: Cause
    entry: dict
    too_large: str | None


class BugNames:
    """The naming of one campaign's bugs. ``host`` is the campaign: its ``worker`` (None: the kernel runs in this
    process, ``resolved`` on ``device``), ``interrupted()``, ``stop_reason``, ``result``, ``on_finding``, and the
    flags ``in_kernel`` and ``explaining`` (the time budget does not cut the models short) and ``last_end``."""

    def __init__(self, host):
        self.host = host
        self.unnamed: dict[str, _Unnamed] = {}  # cause -> its case as found
        self.named: set[str] = set()

    def found(self, verdict, case, cause: Cause, entry: dict) -> None:
        """``case``, saved as ``entry``, is a bug's case as found: named at the end unless a shrink names it."""
        if describes(verdict) and cause.key not in self.named:
            self.unnamed.setdefault(cause.key, _Unnamed(cause, entry, too_large(case)))

    def final(self, verdict, case, cause: Cause, entry: dict) -> None:
        """``case``, saved as ``entry``, is the bug's last: named now, unless the campaign is being interrupted."""
        self.unnamed.pop(cause.key, None)
        if describes(verdict) and cause.key not in self.named and not self.host.interrupted():
            self._name(cause, entry, lambda: self._explain(case))

    def finish(self) -> None:
        """Name the bugs no shrink named, on their cases as found."""
        left, self.unnamed = list(self.unnamed.values()), {}
        if left and self.host.stop_reason in _NOT_NAMING:
            self.host.result.notes.append(f"the defect models named no bug left unshrunk: the campaign stopped "
                                          f"({self.host.stop_reason})")
            return
        try:
            for unnamed in left:
                self._name(unnamed.cause, unnamed.entry, lambda: self._as_found(unnamed))
        except KeyboardInterrupt:  # the cases are all judged and saved: only the naming stops
            self.host.result.notes.append("interrupted while the defect models named the bugs left unshrunk")

    def _as_found(self, unnamed: _Unnamed) -> dict:
        if unnamed.too_large:
            return not_run(unnamed.too_large).as_dict()
        try:
            case = AttentionCase.load(unnamed.entry["path"])
        except (FlashcheckError, OSError) as exc:
            return not_run(f"its saved case could not be read back ({one_line(exc)})").as_dict()
        return self._explain(case)

    def _explain(self, case: AttentionCase) -> dict:
        """The defect models' explanation of ``case`` (``Explanation.as_dict()``), the kernel run where it runs: a
        note in its place when its worker gives none."""
        host, start = self.host, time.monotonic()
        host.explaining = True
        try:
            if host.worker is not None:
                return host.worker.explain(case)
            host.in_kernel = True
            return explained(host.resolved, case, device=host.device).as_dict()
        except ExplainFailed as exc:
            return not_run(str(exc)).as_dict()
        finally:
            host.in_kernel = host.explaining = False
            host.result.time_split[MODELS] += time.monotonic() - start
            host.last_end = time.monotonic()

    def _name(self, cause: Cause, entry: dict, explanation: Callable[[], dict]) -> None:
        self.named.add(cause.key)
        model = explanation()
        self.host.result.bugs.name(cause, entry, model)
        try:  # the saved case carries it too: cheap, and nothing is lost without it
            add_provenance(entry["path"], model=model)
        except (OSError, ValueError) as exc:
            self.host.result.notes.append(f"the defect models' explanation of {entry['path']} is in the summary "
                                          f"only: the case's JSON could not be rewritten ({one_line(exc)})")
        if self.host.on_finding is not None:
            self.host.on_finding(entry)
