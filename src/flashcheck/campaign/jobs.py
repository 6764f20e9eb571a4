"""Worker processes for ``--jobs``: started ("spawn") with their GPU and their share of the cores set in
their environment before they import anything, talked to over a pipe each, and ended on request.
Campaigns (:mod:`.parallel`) and the self-test's rows (:mod:`flashcheck.selftest.parallel`) run on them."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from ..contract.counts import check_count
from ..errors import FlashcheckError
from .interrupts import sigint_ignored_by_children
from .serve import die_with_parent, quiet_interpreter

__all__ = ["Job", "JobError", "THREAD_VARIABLES", "check_jobs", "child_setup", "end_jobs", "messages", "start_jobs",
           "threads_per_worker", "usable_cores", "visible_gpus"]

_POLL_S = 0.25


class JobError(FlashcheckError, RuntimeError):
    """A worker process could not run its part (the same usage error in every worker, as a rule)."""


def check_jobs(jobs, option: str = "--jobs") -> int:
    """``jobs`` if it is a whole number >= 1, else :class:`InvalidArgument` naming ``option``."""
    return check_count(option, jobs, what="a number of worker processes",
                       fix=f"Pass e.g. {option} 4 (several per GPU are fine), or leave it out for one process.")


def visible_gpus(device: str) -> list[str]:
    """The GPUs workers spread over, as ``CUDA_VISIBLE_DEVICES`` entries; none on the CPU."""
    if not str(device).startswith("cuda"):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


# The thread pools of torch (OpenMP, MKL) and numpy (OpenBLAS) each take every core by default: N
# workers would run N times as many threads as cores (measured on an H200 host, 16 cores: 8 workers made
# generation 40x slower). Each worker gets its share, unless the user set the variable.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def usable_cores() -> int:
    """The cores this process may run on (its affinity, as taskset or a container sets it)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        return os.cpu_count() or 1


def threads_per_worker(jobs: int) -> str:
    return str(max(1, usable_cores() // max(jobs, 1)))


@contextmanager
def _child_environment(values: dict):
    # A spawned child copies the parent's environment when it starts: set it for that moment only.
    values = {name: value for name, value in values.items() if value is not None}
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@dataclass
class Job:
    """One worker process and what the parent has received from it."""

    index: int
    process: object
    conn: object
    gpu: str | None
    seed: int | None = None
    findings: list = field(default_factory=list)  # every finding entry it reported
    snapshot: dict | None = None                  # its latest progress snapshot
    summary: dict | None = None
    error: str | None = None                      # why it could not finish ("usage" or "failed" text)
    usage_error: bool = False


def start_jobs(target, payloads: list, device: str, name: str) -> list[Job]:
    gpus = visible_gpus(device)
    ctx = mp.get_context("spawn")
    jobs = []
    for index, payload in enumerate(payloads):
        gpu = gpus[index % len(gpus)] if gpus else None
        parent_end, child_end = ctx.Pipe()
        # Not a daemon: it starts a kernel worker of its own. It dies with the parent all the same (prctl).
        process = ctx.Process(target=target, args=(child_end, index, payload), name=f"{name}-{index}")
        threads = {v: threads_per_worker(len(payloads)) for v in THREAD_VARIABLES if v not in os.environ}
        with _child_environment({"CUDA_VISIBLE_DEVICES": gpu, **threads}):
            with sigint_ignored_by_children():
                process.start()
        child_end.close()  # so that the parent reads EOF once the child is gone
        jobs.append(Job(index, process, parent_end, gpu, seed=payload.get("seed")))
    return jobs


def messages(jobs: list[Job], on_tick=None, ends: bool = False):
    """Every message of every job, as ``(job, kind, payload)``, until each job's pipe has closed
    (with ``ends``, that too: ``(job, "ended", None)``)."""
    open_conns = {job.conn: job for job in jobs}
    while open_conns:
        if on_tick is not None:
            on_tick()
        for conn in wait(list(open_conns), timeout=_POLL_S):
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):  # the worker has ended (what it sent before was read first)
                job = open_conns.pop(conn)
                if ends:
                    yield job, "ended", None
                continue
            yield open_conns[conn], kind, payload


def end_jobs(jobs: list[Job]) -> None:
    for job in jobs:
        job.process.join(timeout=5.0)
        if job.process.is_alive():
            job.process.kill()
            job.process.join(timeout=5.0)
        job.conn.close()


def child_setup() -> None:
    # Ctrl-C reaches the whole process group; the parent decides what the workers do about it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    quiet_interpreter()


# ------------------------------------------------------------------------------------------------
# Campaigns
# ------------------------------------------------------------------------------------------------


