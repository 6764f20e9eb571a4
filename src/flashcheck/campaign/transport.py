"""How a process talks to the worker processes it starts: channels that carry messages, and the transport
that starts workers on this host.

A :class:`Channel` is one end of a pipe; it sends only :class:`~flashcheck.campaign.messages.Message`
instances, each pickled once, and receives them back. The kernel's worker process (:mod:`.worker`) talks
over one, and so does every ``--jobs`` worker.

:class:`ProcessTransport` starts ``--jobs`` workers as "spawn" children of this process, with their GPU and
their share of the cores set in their environment before they import anything, one channel each, and
yields what they send as ``(worker, message)``, :class:`~flashcheck.campaign.messages.Ended` once a
worker's channel closed. It is one implementation of :class:`flashcheck.campaign.scheduler.Transport`:
the policies (:mod:`flashcheck.campaign.scheduler`) see workers and messages, never processes or pipes.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import wait

from .interrupts import sigint_ignored_by_children
from .messages import Ended, Message
from .worker_child import die_with_parent, quiet_interpreter
from .worker_deaths import exit_text

__all__ = ["THREAD_VARIABLES", "Channel", "ProcessTransport", "Worker", "channel_pair", "child_setup", "pickled",
           "threads_per_worker", "usable_cores", "visible_gpus"]

_POLL_S = 0.25


class Channel:
    """One end of a pipe that carries messages, and nothing else."""

    def __init__(self, connection):
        self.connection = connection

    def send(self, message: Message) -> None:
        """Send ``message``; OSError when the other end is gone."""
        self.connection.send_bytes(pickled(message))

    def poll(self, timeout: float = 0.0) -> bool:
        """Whether a message (or the end of the channel) can be read within ``timeout`` seconds."""
        return self.connection.poll(timeout)

    def receive(self) -> Message:
        """The next message; EOFError or OSError once the other end closed and everything sent was read."""
        return pickle.loads(self.receive_pickled())

    def receive_pickled(self) -> bytes:
        """The next message as it was pickled, for a relay that passes it on unread (a cluster's node)."""
        return self.connection.recv_bytes()

    def send_pickled(self, data: bytes) -> None:
        """A message pickled elsewhere (by :func:`pickled`), passed on unread by a relay; OSError when the other
        end is gone."""
        self.connection.send_bytes(data)

    def close(self) -> None:
        self.connection.close()


def pickled(message: Message) -> bytes:
    """``message`` as a channel sends it, for a transport that carries it further first (a cluster)."""
    if not isinstance(message, Message):
        raise TypeError(f"a channel carries flashcheck.campaign.messages only, not {type(message).__name__}")
    return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)


def channel_pair() -> tuple[Channel, Channel]:
    """``(parent's end, child's end)`` of a new pipe, for a "spawn" child."""
    parent_end, child_end = mp.get_context("spawn").Pipe()
    return Channel(parent_end), Channel(child_end)


def visible_gpus(device: str) -> list[str]:
    """The GPUs workers spread over, as ``CUDA_VISIBLE_DEVICES`` entries; none on the CPU."""
    if not str(device).startswith("cuda"):
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [x.strip() for x in listed.split(",") if x.strip()]
    import torch  # only here: counting GPUs needs it, and only when CUDA_VISIBLE_DEVICES is unset

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


def child_setup() -> None:
    """First thing in a ``--jobs`` worker: Ctrl-C reaches the whole process group, and the parent decides
    what the workers do about it; the worker dies with its parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    quiet_interpreter()


@dataclass(eq=False)
class Worker:
    """One worker as a policy sees it: its number, its channel, its GPU (None on the CPU), and on a cluster the
    node that runs it."""

    index: int
    channel: Channel | None
    gpu: str | None
    process: object = None  # the transport's own handle
    node: str | None = None


class ProcessTransport:
    """``--jobs`` workers as "spawn" children of this process on this host. A worker that ends is not replaced:
    on one host, what killed it (the system's out-of-memory killer, a user) would as a rule kill the next."""

    replaces = False

    def __init__(self, device: str):
        self.device = device
        self.workers: list[Worker] = []

    def start(self, child, payloads: list, name: str) -> list[Worker]:
        """One worker per payload, each running ``child(channel, index, payload)``; worker i gets the
        (i mod n)-th visible GPU and its share of the cores."""
        gpus = visible_gpus(self.device)
        ctx = mp.get_context("spawn")
        for index, payload in enumerate(payloads):
            gpu = gpus[index % len(gpus)] if gpus else None
            parent_end, child_end = channel_pair()
            # Not a daemon: it starts a kernel worker of its own. It dies with the parent all the same (prctl).
            process = ctx.Process(target=child, args=(child_end, index, payload), name=f"{name}-{index}")
            threads = {v: threads_per_worker(len(payloads)) for v in THREAD_VARIABLES if v not in os.environ}
            with _child_environment({"CUDA_VISIBLE_DEVICES": gpu, **threads}):
                with sigint_ignored_by_children():
                    process.start()
            child_end.close()  # so that the parent reads EOF once the child is gone
            self.workers.append(Worker(index, parent_end, gpu, process))
        return list(self.workers)

    def events(self, on_tick=None):
        """Every message of every worker as ``(worker, message)``, and ``(worker, Ended())`` once its channel
        closed (what it sent before is read first), until every channel has closed. ``on_tick()`` is
        called at least every quarter second."""
        open_ends = {worker.channel.connection: worker for worker in self.workers}
        while open_ends:
            if on_tick is not None:
                on_tick()
            for connection in wait(list(open_ends), timeout=_POLL_S):
                worker = open_ends[connection]
                try:
                    message = worker.channel.receive()
                except (EOFError, OSError):
                    del open_ends[connection]
                    message = Ended()
                yield worker, message

    def send(self, worker: Worker, message: Message) -> None:
        """``message`` to ``worker``; OSError or ValueError when it is gone."""
        worker.channel.send(message)

    def replace(self, worker: Worker, payload) -> Worker | None:
        return None

    def alive(self, worker: Worker) -> bool:
        return worker.process.is_alive()

    def exitcode(self, worker: Worker) -> int | None:
        return worker.process.exitcode

    def how_ended(self, worker: Worker) -> str:
        return exit_text(worker.process.exitcode)

    def terminate(self, worker: Worker) -> None:
        """Ask it to stop (SIGTERM: a campaign stops at a safe point with its summary)."""
        worker.process.terminate()

    def kill(self, worker: Worker) -> None:
        worker.process.kill()

    def end(self) -> None:
        """Wait a little for every worker to exit, kill those that do not, close the channels."""
        for worker in self.workers:
            worker.process.join(timeout=5.0)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(timeout=5.0)
            worker.channel.close()
