"""The shares of ``fuzz --jobs N`` and ``--cluster``: each worker's part of the campaign's cases and time, and the
workers that run it one after another.

Worker i's share is ``max_examples // N`` drawn cases (the first ``max_examples % N`` one more), every N-th cell of
the covering plan, and the campaign's time budget. Run 0 of it starts with the campaign. Where that run ends before
its share is done and the transport can start another worker in its place (a cluster's, on any node with the
resources free), run 1 takes what is left, and so on:

- *Done* is: a summary that did not stop at ``worker_failed`` (a GPU or a machine failing mid-campaign), every
  case of the share drawn, the share's seconds spent, or, without ``--keep-going``, a bug reported (its campaign
  would have ended there). A campaign stopped by the user, or refused, or crashed in flashcheck, is not run again,
  nor is a share whose :data:`MAX_RUNS` workers were all lost.
- *What is left*: the share's cases less those its runs drew (the most of what each reported and what it wrote in
  the progress record, :mod:`flashcheck.campaign.progress`), and its seconds less those its runs spent.
- *No case judged twice*: run g > 0 draws with a seed of its own, ``sha256(f"{seed}/job{i}/run{g}")``
  (:func:`run_seed`), leaves out the covering cells of its share that its predecessors drew, and draws the
  values of the others anew (:class:`~flashcheck.inputs.covering.PlanShare`'s ``skip`` and ``run``). A case its
  predecessor judged but had not reported yet is not drawn again either: the new seed draws other cases.

A campaign resumed after its driver died (:mod:`flashcheck.campaign.progress`) follows the same rules: each run
read back from the record is a run that ended, and each share not done gets its next run.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from ..bugs import bugs_with_findings
from ..combine import combined_verdict
from ..config import CampaignConfig
from ..result import CampaignResult
from ..summary import CampaignSummary
from ..transport import Worker

__all__ = ["MAX_RUNS", "MIN_LEFT_S", "Run", "Share", "ShareRun", "job_seed", "run_seed"]

MIN_LEFT_S = 1.0  # a share with less time than this left is done: a new worker would not get to its first case
MAX_RUNS = 8      # a share lost this many times ends there (a node that fails every worker it gets, a GPU that fails)


def job_seed(seed: int | None, index: int, jobs: int) -> int | None:
    """Worker ``index``'s seed: the campaign's own with one worker, else derived from (seed, index)."""
    if seed is None or jobs == 1:
        return seed
    return int(hashlib.sha256(f"{seed}/job{index}".encode()).hexdigest()[:16], 16)


def run_seed(seed: int | None, index: int, jobs: int, run: int) -> int | None:
    """The seed of run ``run`` of worker ``index``'s share: run 0 :func:`job_seed`'s, the others their own."""
    if seed is None or run == 0:
        return job_seed(seed, index, jobs)
    return int(hashlib.sha256(f"{seed}/job{index}/run{run}".encode()).hexdigest()[:16], 16)


@dataclass(frozen=True)
class ShareRun:
    """What a worker is started with: its campaign, which run of its share it is, and the progress record's
    folder it writes (None: none kept)."""

    config: CampaignConfig
    run: int = 0
    record: str | None = None


@dataclass(eq=False)
class Run:
    """One run of a share, as the driver knows it: what its worker reported, or what an earlier driver's run of it
    left in the progress record (``worker`` None)."""

    share: "Share"
    number: int
    config: CampaignConfig
    worker: Worker | None = None
    findings: list = field(default_factory=list)  # every finding entry it reported
    snapshot: CampaignSummary | None = None       # its latest progress snapshot
    summary: CampaignSummary | None = None
    error: str | None = None                      # why it could not finish
    usage_error: bool = False
    recorded: int = 0                             # cases it wrote in the progress record as drawn
    ended: str | None = None                      # how it ended, where it ended without a summary
    lost: dict | None = None                      # what the summary says of its loss
    earlier: bool = False                         # read back from the record of an earlier driver

    @property
    def name(self) -> str:
        return f"worker{self.share.index}" + (f".{self.number}" if self.number else "")

    @property
    def latest(self) -> CampaignSummary | None:
        return self.summary or self.snapshot

    @property
    def drawn(self) -> int:
        return max(self.recorded, self.latest.examples if self.latest else 0)

    @property
    def unfinished(self) -> bool:
        """Whether it ended before its share was done: no summary, or one that says a worker failed."""
        return self.summary is None or self.summary.stopped == "worker_failed"

    def partial_summary(self, kernel_name: str) -> CampaignSummary:
        """Its summary where it ended without one: its last snapshot, and every finding it reported."""
        target = self.config.target
        base = self.snapshot or CampaignResult(verdict="", kernel=kernel_name, device=str(target.device),
                                               preset=target.preset.name, seed=self.config.drawing.seed,
                                               isolation="worker").summary()
        how = "failed (" + self.error.strip().splitlines()[-1] + ")" if self.error else f"ended ({self.ended})"
        note = (f"worker {self.name.removeprefix('worker')} {how} without a summary: its counts are those of its "
                f"last progress report ({base.cases} cases), its findings the {len(self.findings)} it reported")
        partial = dataclasses.replace(
            base, findings=list(self.findings), stopped="worker_failed" if self.error else "worker_died",
            notes=list(base.notes or []) + [note], case_log=None, case_log_sha256=None,
            bugs=bugs_with_findings(base.bugs or [], self.findings))
        return dataclasses.replace(partial, verdict=combined_verdict([partial]))


@dataclass(eq=False)
class Share:
    """Worker ``index``'s part of the campaign of ``seed``: ``examples`` drawn cases within ``seconds`` (None: no
    time budget), and the runs that took it on, in order. ``first`` is run 0's campaign."""

    index: int
    examples: int
    seconds: float | None
    first: CampaignConfig
    seed: int | None
    runs: list = field(default_factory=list)

    def left(self, keep_going: bool) -> tuple[int, float | None] | None:
        """``(cases, seconds)`` its runs have left; None where it is done."""
        if not keep_going and any(f.get("status") == "BUG" for run in self.runs for f in run.findings):
            return None
        cases = self.examples - sum(run.drawn for run in self.runs)
        spent = sum(run.latest.elapsed_s for run in self.runs if run.latest is not None)
        seconds = None if self.seconds is None else self.seconds - spent
        if cases <= 0 or (seconds is not None and seconds < MIN_LEFT_S):
            return None
        return cases, seconds

    @property
    def exhausted(self) -> bool:
        return len(self.runs) >= MAX_RUNS

    def next_run(self, keep_going: bool, jobs: int) -> Run | None:
        """Its next run, with what is left of it, where it is not done."""
        unfinished = not self.runs or (self.runs[-1].unfinished and not self.exhausted)
        left = self.left(keep_going) if unfinished else None
        if left is None:
            return None
        number = len(self.runs)
        config = self.first
        if number:
            drawn = sum(run.drawn for run in self.runs)
            plan = config.drawing.plan[:4] + (drawn, number)  # PlanShare: skip the cells drawn, draw anew
            config = config.replace(max_examples=left[0], time_budget=left[1], plan=plan,
                                    seed=run_seed(self.seed, self.index, jobs, number))
        run = Run(self, number, config)
        self.runs.append(run)
        return run
