"""``fuzz --jobs N``: one campaign spread over N processes (the self-test's rows use the same transport:
:mod:`flashcheck.selftest.parallel`).

**Campaigns.** :func:`run_campaigns` starts N worker processes
(:class:`~flashcheck.campaign.transport.ProcessTransport`), each running
:func:`flashcheck.campaign.run.run_campaign` with a hypothesis engine and a seed of its own
(:mod:`flashcheck.campaign.scheduler.seeds`), its kernel in a kernel worker process as usual, all sharing
one corpus and one example database. The parent shows one progress display and writes one summary:
:func:`flashcheck.campaign.combine.combine_summaries` of the workers' summaries, with one entry per
worker in ``sources`` and ``"jobs": N``.

*Determinism.* Worker i of N > 1 draws with the seed ``sha256(f"{seed}/job{i}")`` (one seed fixes every
worker, as :func:`~flashcheck.campaign.run.run_campaign` derives one per round) and runs ``max_examples // N``
drawn cases, the first ``max_examples % N`` workers one more. Hypothesis's reuse phase replays what the
example database holds when a worker starts, which could be what another worker saved a moment before;
with a seed, workers therefore skip that phase (they still write the database, so a campaign without a
seed, here or on another machine, replays their failures first), and the seed and N alone fix each
worker's cases. Without a seed every worker replays the shared database, as fuzzers share findings.

*GPUs.* Worker i gets the (i mod n)-th of the n visible GPUs through ``CUDA_VISIBLE_DEVICES``, set in its
environment before it starts (so before it imports torch); N may exceed n. On the CPU nothing is set.

*Starting.* The workers start before the parent resolves the kernel (the parent's usage errors still come
first: they are raised, and the workers killed, before any case is waited for), and each worker starts
its kernel's worker process (:class:`flashcheck.campaign.worker.WorkerProcess`) before it imports torch itself, so
the imports overlap. Only on a GPU with ``CUDA_VISIBLE_DEVICES`` unset does the parent import torch
before starting them, to count the GPUs. Their ``first_case_s`` count from the parent's start; the
combined one is the earliest.

*Nothing found is lost.* A worker sends the parent each finding's summary entry as soon as its case is
saved (the corpus has it already), a progress snapshot at most every half second, and its summary at
the end, over a pipe of its own, which keeps what was sent even when the worker is killed. On Ctrl-C or
SIGTERM the parent sends every worker SIGTERM (a campaign's own interruption: it stops at a safe point,
keeps its shrink's progress and returns its summary), again every second until they have all ended, and
kills those still running after ``STOP_GRACE_S``. A worker that ended without a summary is combined from
what it sent: its last snapshot's counts and every finding it reported, with a note on how it ended, so
the combined verdict still counts its findings.

*On a cluster* (``cluster``: :class:`~flashcheck.campaign.ray_transport.RayTransport`) a worker lost before its
share was done is followed by one that takes what is left (:mod:`flashcheck.campaign.scheduler.shares`). With a
seed, the workers' progress is kept in the corpus (:mod:`flashcheck.campaign.progress`): the campaign is marked done
when this returns, and a campaign whose driver died is resumed by the next call of the same campaign.
"""

from __future__ import annotations

import time

from ..errors import InvalidArgument
from .config import CampaignConfig
from .interrupts import stop_requests
from .scheduler import check_jobs, run_workers
from .scheduler.seeds import SeedShares
from .summary import CampaignSummary
from .ray_transport import make_transport

__all__ = ["run_campaigns"]


def run_campaigns(config: CampaignConfig, *, jobs: int, progress=None, cluster: str | None = None) -> CampaignSummary:
    """One campaign of ``config`` (its kernel by name: each worker resolves it) in ``jobs`` worker processes;
    returns the combined summary. ``progress(totals)`` gets a
    :class:`~flashcheck.campaign.scheduler.seeds.Totals` whenever a worker reports. The config's
    ``started_at`` (default now) is what each worker's ``first_case_s`` counts from. ``cluster``: a Ray address
    (:func:`~flashcheck.campaign.ray_transport.check_cluster`) whose nodes run the workers instead of this host."""
    check_jobs(jobs, "jobs")
    if not config.target.by_name:
        raise InvalidArgument("kernel", config.target.kernel, "worker processes resolve the kernel by its name",
                              "Pass a built-in name or 'package.module:function', or run_campaign for an object.")
    if config.started_at is None:
        config = config.replace(started_at=time.monotonic())
    policy = SeedShares(config, jobs, progress)
    prepared = []

    def prepare() -> None:
        # The workers start first and import while this process resolves the kernel for its own checks.
        from .setup import prepare_campaign  # torch: imported while the workers import theirs

        prepared.append(prepare_campaign(config))

    transport = make_transport(config.target.device, cluster)  # a cluster that cannot be reached keeps the record
    try:
        with stop_requests(policy.request_stop):
            run_workers(policy, transport, meanwhile=prepare)
        return policy.summary(prepared[0].kernel.name)
    finally:
        policy.end_record()  # the workers ran and ended here: nothing to resume
