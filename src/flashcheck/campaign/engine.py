"""Driving hypothesis: one engine for campaigns and for ``property_test``.

Both build a hypothesis test around a body that judges one drawn recipe, run it with the same settings
(no deadline, no health checks, one bug at a time), and shrink the first failure the same way: every
failure is remembered by its drawn input, so hypothesis's final replay needs no kernel call, and once the
time for shrinking is out, known failures fail again from memory and anything else passes, which ends the
shrink at once with the smallest failing case so far. A failure hypothesis cannot reproduce (``Flaky``)
leaves the smallest one that did fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from unittest import SkipTest

from hypothesis import HealthCheck, Verbosity, given, settings, target
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from ..hypothesis_internals import add_digest, set_database_key

__all__ = ["Climb", "Failure", "Outcome", "Shrink", "hypothesis_test", "run_test"]


class Failure(Exception):
    """A failing case, carrying what its judge made of it (``payload``)."""

    def __init__(self, payload):
        super().__init__(getattr(payload, "status", "failure"))
        self.payload = payload


@dataclass
class Shrink:
    """What one hypothesis run knows of the failure it shrinks: the first (saved as found), the latest
    (the smallest so far), and every failure by its drawn input, to replay from memory."""

    first: object = None
    best: object = None
    failures: dict = field(default_factory=dict)
    deadline: float = math.inf  # the time shrinking may take, once a failure is found
    cut: bool = False           # the shrink was cut short (out of time, a worker that could not start)

    @property
    def shrinking(self) -> bool:
        return self.first is not None

    def fail(self, key, payload):
        """Record a failure of drawn input ``key`` and raise it."""
        if self.first is None:
            self.first = payload
        self.failures[key] = self.best = payload
        self.raise_known(key)

    def raise_known(self, key) -> None:
        """Fail again if ``key`` failed before. The one place that raises: hypothesis tells failures apart
        by where they were raised, and a failure replayed from memory must look like the first."""
        if key in self.failures:
            raise Failure(self.failures[key])

    def out_of_time(self, key) -> None:
        """The shrink's time is out: a known failure fails again, anything else passes."""
        self.cut = True
        self.raise_known(key)


def hypothesis_test(body, *, given_args: dict, max_examples: int, seed: int | None, database=None,
                    phases=None, verbosity=Verbosity.quiet, digest: bytes | None = None):
    """``body`` as a hypothesis test over ``given_args``; ``digest`` keys its database entries and random
    stream (a test id), ``phases=None`` keeps hypothesis's own."""
    if digest is not None:
        add_digest(body, digest)
    test = given(**given_args)(body)
    if seed is not None:  # before settings: @seed sets database=None, and settings set it back
        test = hypothesis_seed(seed)(test)
    options = dict(max_examples=max_examples, deadline=None, database=database, verbosity=verbosity,
                   suppress_health_check=list(HealthCheck), report_multiple_bugs=False)
    if phases is not None:
        options["phases"] = phases
    test = settings(**options)(test)
    set_database_key(test, body, digest)
    return test


@dataclass
class Climb:
    """hypothesis's target phase, told of a case's score (its error/budget) only when it is at least the
    best so far in its hypothesis run (one Climb a run).

    Hill climbing keeps a move whose score is at least the best, so it climbs as if told every score. What
    it saves is hypothesis's pareto front: every case that reports a score joins it, with a dominance test
    against the front (a front as large as the distinct regime and dtype events), which cost more of a fast
    kernel's case than the campaign's own drawing; the front only seeds later runs, which flashcheck's
    replay never reads."""

    label: str
    best: float = -math.inf

    def observe(self, score: float) -> None:
        if math.isfinite(score) and score >= self.best:
            self.best = score
            target(score, label=self.label)


@dataclass
class Outcome:
    """How one hypothesis run ended: on the failure it shrank (``failure``), or not; ``flaky`` when
    hypothesis could not reproduce a failure (then ``failure`` is the smallest one that did fail)."""

    failure: object = None
    flaky: bool = False


def run_test(test, shrink: Shrink) -> Outcome:
    """Run ``test``; a run with nothing to do (a replay of an empty database) ends with no failure."""
    try:
        test()
    except Failure as found:
        return Outcome(found.payload)
    except Flaky:
        return Outcome(shrink.best, flaky=True)
    except SkipTest:
        pass
    return Outcome()
