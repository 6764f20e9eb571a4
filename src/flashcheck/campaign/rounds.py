"""The schedule of a campaign's hypothesis runs. First the failures stored in the example database, for
every dtype; then the covering order (:mod:`flashcheck.inputs.covering`), one engine per planned case, the
dtypes in turn, so that every regime, mask, scale, layout, causal alignment and dtype is judged within the
first cases, and their pairs after; then free drawing: one engine per dtype, one dtype after the other,
each with its share of the cases and of the time, and within a dtype one run per distinct bug
(hypothesis stops at the first failure), each later run with fresh randomness derived from the seed.
The test body they drive, and what it does with each case, is the campaign's (:mod:`.run`)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import random
import time
from dataclasses import dataclass

from hypothesis import Phase

from ..inputs.covering import PlanShare, planned_choices
from .database import KeyedDatabase, PlannedDatabase
from .engine import Climb, Shrink, hypothesis_test, run_test

__all__ = ["STORED_NOT_SHRUNK", "Schedule", "Stop"]

STORED_NOT_SHRUNK = ("an earlier campaign of this kernel stored it in the example database, and hypothesis does not "
                     "shrink a stored failure again")


class Stop(Exception):
    """The time budget ran out or the user interrupted: end the campaign, keep what was found."""


@dataclass
class _Round(Shrink):
    """What the test body knows about one hypothesis run of the campaign; its failures are
    ``(verdict, case, cause)`` of the one cause it shrinks."""

    signature: str | None = None  # the cause of the bug being shrunk; None while hypothesis generates
    generated: int = 0            # cases generated (not shrink candidates): they count to max_examples
    shrink_tries: int = 0         # shrink candidates run
    stored: bool = False          # a replay of the failures stored in the example database
    # hypothesis's target phase climbs towards larger errors, from this run's best
    climb: Climb = dataclasses.field(default_factory=lambda: Climb("error/budget"))


def _round_seed(seed: int | None, round_no: int) -> int | None:
    # Round 0 keeps the seed as given; later rounds derive theirs, so one seed still fixes every case.
    if seed is None or round_no == 0:
        return seed
    return int(hashlib.sha256(f"{seed}/{round_no}".encode()).hexdigest()[:16], 16)


class Schedule:
    """The hypothesis runs of one campaign. ``host`` is the campaign: its ``body`` (the test body), its
    ``stop_reason`` (why it stops, shared with its signal handler), its ``record_shrunk`` and its result."""

    def __init__(self, host, strategies: dict, *, pools: dict, database, seed: int | None, reuse: bool,
                 keep_going: bool, covering: bool = True, plan: PlanShare | None = None):
        self.host, self.strategies, self.pools, self.seed = host, strategies, pools, seed  # dtype -> each
        self.database, self.reuse, self.keep_going, self.covering = database, reuse, keep_going, covering
        self.plan = plan  # the part of a covering plan shared with other workers (None: a plan of its own)
        self.planned = 0  # cases of the covering order run
        self.deadline = self.until = math.inf  # the current dtype's, the campaign's
        self.round = _Round()
        self.round_no = 0
        self.generated = 0  # cases drawn (not shrink candidates): they count to max_examples

    def _make_test(self, strategy, *, examples: int, database, phases: tuple):
        round_seed = _round_seed(self.seed, self.round_no)
        self.round_no += 1
        return hypothesis_test(self.host.body, given_args=dict(recipe=strategy), max_examples=examples, seed=round_seed,
                               database=database, phases=phases)

    def run(self, max_examples: int, *, until: float) -> str:
        """Stored failures, the covering order, then free drawing; returns why the campaign stopped."""
        self.until = until
        # One database per dtype, keys apart: another strategy would read a dtype's choices as another case.
        # (Keyed by its dtype also alone: a campaign of one dtype replays what one of several stored for it.)
        strata = [(dtype, strategy, KeyedDatabase(self.database, dtype)) for dtype, strategy in self.strategies.items()]
        if self.reuse and self._replay_stored(strata, max_examples):
            if not self.keep_going or self.host.stop_reason:
                return self.host.stop_reason or "bug_found"
        stopped = self._cover(dict((d, (s, db)) for d, s, db in strata), max_examples) if self.covering else None
        return stopped or self._free(strata, max_examples)

    def _free(self, strata: list, max_examples: int) -> str:
        """Each dtype draws its share of the cases left, in a hypothesis engine of its own, one dtype after
        the other. Hypothesis's free drawing over several dtypes is lumpy (25 cases over fp16 and fp32
        gave 22 and 3), which would starve a sign-off cell of its dtype."""
        for i, (_, strategy, database) in enumerate(strata):
            left = len(strata) - i
            now = time.monotonic()
            self.deadline = now + (self.until - now) / left  # the time left, shared the same way
            try:
                stopped = self._rounds(strategy, database, math.ceil((max_examples - self.generated) / left))
            except Stop:
                stopped = self.host.stop_reason or "time_budget"
            if self._share_spent(stopped, more=left > 1):
                continue
            if stopped != "max_examples":
                return stopped
        return "max_examples"

    def _share_spent(self, stopped: str, *, more: bool) -> bool:
        """A time share ran out (maybe while shrinking), and the campaign's has not: the next one's turn."""
        if stopped == "time_budget" and more and time.monotonic() < self.until:
            self.host.stop_reason = None
            return True
        return False

    def _cover(self, strata: dict, max_examples: int) -> str | None:
        """The covering order's cases, each in an engine of its own (a failing one is shrunk there), within
        their share of the cases and half the time; returns why the campaign stopped, or None to go on."""
        pools = dict(next(iter(self.pools.values())), dtype=list(self.strategies))
        share = self.plan if self.plan is not None else PlanShare(self.seed)
        if share.seed is None:  # without a seed, new cases
            share = dataclasses.replace(share, seed=random.randrange(2**32))
        plan = share.cells(pools, max_examples)
        now = time.monotonic()
        self.deadline = now + (self.until - now) / 2
        for i, cell in enumerate(plan):
            if self.generated >= max_examples:
                return "max_examples"
            strategy, database = strata[cell["dtype"]]
            planned = planned_choices(strategy, self.pools[cell["dtype"]], cell, seed=share.cell_seed(i))
            if planned is None:
                continue  # this hypothesis draws otherwise: the cell is left to free drawing
            test = self._make_test(strategy, examples=1, database=PlannedDatabase(database, planned.choices),
                                   phases=(Phase.reuse, Phase.shrink))
            self.planned += 1
            try:
                found = self._run_round(test)
            except Stop:
                stopped = self.host.stop_reason or "time_budget"
                return None if self._share_spent(stopped, more=True) else stopped
            if found and not self.keep_going:
                return "bug_found"
            if self.host.stop_reason:
                return self.host.stop_reason
        return None

    def _replay_stored(self, strata: list, max_examples: int) -> bool:
        """Replay every dtype's stored failures before any dtype draws a case; True when one failed. (The
        passing cases hypothesis keeps for its target phase are not replayed.)"""
        found = False
        for dtype, strategy, _ in strata:
            test = self._make_test(strategy, examples=max_examples,
                                   database=KeyedDatabase(self.database, dtype, failures_only=True),
                                   phases=(Phase.explicit, Phase.reuse, Phase.shrink))
            if self._run_round(test, stored=True):
                found = True
                if not self.keep_going or self.host.stop_reason:
                    break
        self.round_no = 0  # the first dtype's first round keeps the seed as given
        return found

    def _rounds(self, strategy, database, examples: int) -> str:
        """Run hypothesis once per bug (once in all without keep_going) until ``examples`` more cases are
        drawn; returns why it stopped."""
        end = self.generated + examples
        while self.generated < end:
            test = self._make_test(strategy, examples=end - self.generated, database=database,
                                   phases=(Phase.generate, Phase.target, Phase.shrink))
            # Later rounds skip the database: it holds the failures just shrunk, which would only count
            # again, and with one hypothesis keeps a pareto front that draws the later rounds back to them.
            database = None
            if not self._run_round(test):
                return "max_examples"
            if not self.keep_going:
                return "bug_found"
            if self.host.stop_reason:
                return self.host.stop_reason
        return "max_examples"

    def _run_round(self, test, *, stored: bool = False) -> bool:
        """Run one hypothesis engine; True when it ended on a failure (shrunk and recorded)."""
        rnd = self.round = _Round(stored=stored)
        try:
            outcome = run_test(test, rnd)
        finally:
            self.generated += rnd.generated
        if outcome.flaky and rnd.signature is None and self.host.stop_reason:
            # hypothesis replayed a case that had passed, after the time ran out: the stop, not a flaky kernel
            raise Stop()
        if outcome.flaky:  # hypothesis could not reproduce the failure: keep the smallest case that did fail
            self.host.result.notes.append(f"a {rnd.signature} failure did not reproduce on replay (a flaky kernel)")
        if outcome.failure is None:
            return outcome.flaky
        # hypothesis keeps a stored failure that fails again as it was (it takes it for one it shrank before)
        not_shrunk = STORED_NOT_SHRUNK if rnd.stored and not rnd.shrink_tries and not outcome.flaky else None
        self.host.record_shrunk(*outcome.failure, complete=not (rnd.cut or outcome.flaky), not_shrunk=not_shrunk)
        return True

