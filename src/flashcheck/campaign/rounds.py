"""The schedule of a campaign's hypothesis runs: one engine per dtype, one dtype after the other, each with
its share of the cases and of the time; within a dtype one run per distinct bug (hypothesis stops at the
first failure), each later run with fresh randomness derived from the seed; stored failures replayed first.
The test body they drive, and what it does with each case, is the campaign's (:mod:`.run`)."""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass

from hypothesis import Phase

from .database import KeyedDatabase
from .engine import Shrink, hypothesis_test, run_test

__all__ = ["Schedule", "Stop"]


class Stop(Exception):
    """The time budget ran out or the user interrupted: end the campaign, keep what was found."""


@dataclass
class _Round(Shrink):
    """What the test body knows about one hypothesis run of the campaign; its failures are
    ``(verdict, case, cause)`` of the one cause it shrinks."""

    signature: str | None = None  # the cause of the bug being shrunk; None while hypothesis generates
    generated: int = 0            # cases generated (not shrink candidates): they count to max_examples


def _round_seed(seed: int | None, round_no: int) -> int | None:
    # Round 0 keeps the seed as given; later rounds derive theirs, so one seed still fixes every case.
    if seed is None or round_no == 0:
        return seed
    return int(hashlib.sha256(f"{seed}/{round_no}".encode()).hexdigest()[:16], 16)


class Schedule:
    """The hypothesis runs of one campaign. ``host`` is the campaign: its ``body`` (the test body), its
    ``stop_reason`` (why it stops, shared with its signal handler), its ``record_shrunk`` and its result."""

    def __init__(self, host, strategies: dict, *, database, seed: int | None, reuse: bool, keep_going: bool):
        self.host, self.strategies, self.database, self.seed = host, strategies, database, seed  # dtype ->
        self.reuse, self.keep_going = reuse, keep_going
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
        """Each dtype draws its share of the cases, in a hypothesis engine of its own, one dtype after the
        other; returns why the campaign stopped. Hypothesis's free drawing over several dtypes is lumpy
        (25 cases over fp16 and fp32 gave 22 and 3), which starves a sign-off cell of its dtype."""
        self.until = until
        strata = [(dtype, strategy, KeyedDatabase(self.database, dtype) if len(self.strategies) > 1 else
                   self.database) for dtype, strategy in self.strategies.items()]
        if self.reuse and len(strata) > 1 and self._replay_stored(strata, max_examples):
            if not self.keep_going or self.host.stop_reason:
                return self.host.stop_reason or "bug_found"
        for i, (_, strategy, database) in enumerate(strata):
            left = len(strata) - i
            now = time.monotonic()
            self.deadline = now + (self.until - now) / left  # the time left, shared the same way
            try:
                stopped = self._rounds(strategy, database, math.ceil((max_examples - self.generated) / left),
                                       reuse=self.reuse and len(strata) == 1)
            except Stop:
                stopped = self.host.stop_reason or "time_budget"
            if stopped == "time_budget" and left > 1 and time.monotonic() < self.until:
                self.host.stop_reason = None  # this dtype's share of the time is spent (maybe while shrinking)
                continue
            if stopped != "max_examples":
                return stopped
        return "max_examples"

    def _replay_stored(self, strata: list, max_examples: int) -> bool:
        """Replay every dtype's stored failures before any dtype draws a case; True when one failed. (The
        passing cases hypothesis keeps for its target phase are not replayed in a campaign over dtypes.)"""
        found = False
        for dtype, strategy, _ in strata:
            test = self._make_test(strategy, examples=max_examples,
                                   database=KeyedDatabase(self.database, dtype, failures_only=True),
                                   phases=(Phase.explicit, Phase.reuse, Phase.shrink))
            if self._run_round(test):
                found = True
                if not self.keep_going or self.host.stop_reason:
                    break
        self.round_no = 0  # the first dtype's first round keeps the seed as given
        return found

    def _rounds(self, strategy, database, examples: int, *, reuse: bool) -> str:
        """Run hypothesis once per bug (once in all without keep_going) until ``examples`` more cases are
        drawn; returns why it stopped."""
        end = self.generated + examples
        # Later rounds skip the database: it holds the failures just shrunk, which would only count again,
        # and with one hypothesis keeps a pareto front that draws the later rounds back to them.
        phases = (Phase.explicit, Phase.reuse) if reuse else ()
        while self.generated < end:
            test = self._make_test(strategy, examples=end - self.generated, database=database,
                                   phases=phases + (Phase.generate, Phase.target, Phase.shrink))
            phases, database = (), None
            if not self._run_round(test):
                return "max_examples"
            if not self.keep_going:
                return "bug_found"
            if self.host.stop_reason:
                return self.host.stop_reason
        return "max_examples"

    def _run_round(self, test) -> bool:
        """Run one hypothesis engine; True when it ended on a failure (shrunk and recorded)."""
        rnd = self.round = _Round()
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
        self.host.record_shrunk(*outcome.failure, complete=not (rnd.cut or outcome.flaky))
        return True

