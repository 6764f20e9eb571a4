"""The exact properties within a share of a campaign's time.

The properties (a second call, poisoned masked-out keys, NaN guard bands, another layout, a sequence run
alone) cost up to five more kernel calls a case: checked on every case they would take most of a short
campaign (under the Triton interpreter, 40 s of a 99 s campaign on every fourth case). They run while
their time stays within ``share`` of the campaign's (default 25%), first on the cases where they can
fail: masked-out keys (masks, causal alignments), a non-contiguous layout, a batch; on the others only
while they have spent less than half their share. While a bug is shrunk, every candidate gets the
properties if the bug is one of theirs (it must show again), none otherwise.
"""

from __future__ import annotations

import time
from collections import Counter

from ..judge.properties import PROPERTIES, PROPERTY_KINDS
from .result import properties_summary

__all__ = ["PROPERTY_SHARE", "RERUNS", "PropertyShare", "promising", "work"]

PROPERTY_SHARE = 0.25
RERUNS = 5  # kernel calls the properties make at most on a case


def work(recipe) -> int:
    """A case's work, up to a constant: what a kernel's time grows with."""
    s = recipe.shapes
    return s.batch * s.heads_q * max(s.n_q, 16) * max(s.n_k, 16) * (s.head_dim + s.head_dim_v)


def promising(recipe) -> bool:
    """Whether the properties can fail on this case beyond a second call and the guard bands."""
    return (recipe.mask != "none" or recipe.causal != "none" or recipe.layout != "contiguous"
            or recipe.shapes.batch > 1)


class PropertyShare:
    """Which cases of a campaign get the properties, and what they cost."""

    def __init__(self, share: float = PROPERTY_SHARE):
        self.share = share
        self.start = time.monotonic()
        self.spent = 0.0         # seconds the properties took
        self.cases = Counter()   # property -> cases it judged
        self.checked_work = 0    # the work (see :func:`work`) of the cases that got properties
        self.kernel_time, self.seen_work = 0.0, 0  # the kernel's first calls, over the work of all cases

    def choose(self, recipe, *, shrinking: frozenset | None = None) -> tuple:
        """The properties for this case; ``shrinking``: the finding kinds of the bug being shrunk."""
        if shrinking is not None:
            return PROPERTIES if shrinking & PROPERTY_KINDS else ()
        cost = self._cost(recipe)
        if cost is None:
            return ()  # the first case only gives the kernel's cost
        # within the share of the time by the end of this case's properties
        allowance = self.share * (time.monotonic() - self.start + cost)
        if self.spent + cost <= allowance / 2 or (self.spent + cost <= allowance and promising(recipe)):
            return PROPERTIES
        return ()

    def _cost(self, recipe) -> float | None:
        """What the properties would cost on this case: their seconds per unit of work so far (before any,
        five kernel calls' worth), times the case's work (a kernel's time grows with B Hq Nq Nk (D + Dv))."""
        if self.checked_work:
            return self.spent / self.checked_work * work(recipe)
        if self.seen_work:
            return RERUNS * self.kernel_time / self.seen_work * work(recipe)
        return None

    def record(self, verdict, recipe) -> None:
        self.spent += verdict.elapsed.get("properties", 0.0)
        self.cases.update(verdict.properties)
        if verdict.properties:
            self.checked_work += work(recipe)
        self.kernel_time += verdict.elapsed.get("kernel", 0.0)
        self.seen_work += work(recipe)

    def as_dict(self, elapsed: float) -> dict:
        # a serving form's own properties (isolation, page_order) after the dense ones, where its cases had them
        names = list(PROPERTIES) + sorted(set(self.cases) - set(PROPERTIES))
        return properties_summary(names, self.share, dict(self.cases), self.spent, elapsed)
