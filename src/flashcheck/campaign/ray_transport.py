"""Workers on a Ray cluster: a :class:`flashcheck.campaign.scheduler.Transport` whose workers run on the
cluster's nodes (``fuzz --cluster ray[://ADDRESS]``).

Each worker is a Ray actor (:class:`_Node`) with its resources declared (one GPU on a GPU campaign, which Ray
grants through ``CUDA_VISIBLE_DEVICES``; one CPU otherwise). On its node the actor starts the worker as
``--jobs`` does on this host (:class:`~flashcheck.campaign.transport.ProcessTransport`: a "spawn" child with its
channel), and relays every message the child sends, as the child pickled it, into one queue on the driver
(a Ray queue actor). The policies see the same workers and messages as with ``--jobs``: the seeds, the
corpus and the example database are the campaign's (a corpus every node reaches, a Redis example database).

A worker's end is its channel's end: the child exited, was killed, or its node died (the actor's relay then
fails, which the driver sees as the worker's end). What it reported before is kept, as with ``--jobs``.

Ray is an optional dependency: ``pip install 'flashcheck[ray]'``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import pickle
import threading

from ..errors import InvalidArgument
from .messages import Ended
from .transport import Channel, Worker, channel_pair

__all__ = ["RayTransport", "check_cluster"]

_POLL_S = 0.25
_INSTALL = "pip install 'flashcheck[ray]' (Ray 2.60 or later), or run without --cluster."


def check_cluster(value: str | None) -> str | None:
    """The Ray address of ``--cluster`` (``"ray"``: this host's cluster or a new local one; ``ray://HOST:PORT`` or
    ``HOST:PORT``: that cluster's), or None without it; exit 2 where Ray is missing or the value is not Ray's."""
    if value is None:
        return None
    if value != "ray" and not value.startswith("ray://"):
        raise InvalidArgument("--cluster", value, "not a Ray cluster",
                              "Pass --cluster ray (a local or this host's cluster) or --cluster ray://HOST:PORT.")
    if importlib.util.find_spec("ray") is None:
        raise InvalidArgument("--cluster", value, "Ray is not installed", _INSTALL)
    return "auto" if value == "ray" else value


class _Relay:
    """A worker on its node: its child process and the thread that forwards what the child sends."""

    def __init__(self, child, index: int, payload, queue):
        parent_end, child_end = channel_pair()
        # Ray set the actor's GPU and thread counts in its environment: the child inherits them.
        self.process = mp.get_context("spawn").Process(target=child, args=(child_end, index, payload),
                                                       name=f"flashcheck-ray-{index}")
        self.process.start()
        child_end.close()
        self.thread = threading.Thread(target=self._forward, args=(parent_end, index, queue), daemon=True)
        self.thread.start()

    def _forward(self, channel: Channel, index: int, queue) -> None:
        while True:
            try:
                data = channel.receive_pickled()
            except (EOFError, OSError):
                break
            queue.put((index, data))
        self.process.join()
        queue.put((index, None))  # the channel closed: everything the child sent is in the queue before this


def _node_class(ray):
    @ray.remote(max_concurrency=4)
    class _Node:
        """One worker's actor: its child and relay on the node Ray placed it on."""

        def start(self, child, index: int, payload, queue) -> int:
            self.relay = _Relay(child, index, payload, queue)
            return self.relay.process.pid

        def wait(self) -> int | None:
            """Returns once the worker's messages are all in the queue: its exit code."""
            self.relay.thread.join()
            return self.relay.process.exitcode

        def alive(self) -> bool:
            return self.relay.process.is_alive()

        def pids(self) -> tuple[int, int]:
            """(this actor's process, its worker's child): what a node's own tools see."""
            import os  # noqa: PLC0415 -- on the node, where the actor runs

            return os.getpid(), self.relay.process.pid

        def signal(self, kill: bool) -> None:
            (self.relay.process.kill if kill else self.relay.process.terminate)()

    return _Node


class RayTransport:
    """Workers as Ray actors on the cluster at ``address`` (``"auto"``: this host's, or a new local one)."""

    def __init__(self, device: str, address: str):
        import ray  # noqa: PLC0415 -- the optional dependency, only with --cluster

        from ray.util.queue import Queue  # noqa: PLC0415 -- as ray

        self.ray, self.device = ray, device
        if not ray.is_initialized():
            try:
                ray.init(address=address, log_to_driver=False, include_dashboard=False, logging_level="ERROR")
            except ConnectionError:
                if address != "auto":
                    raise InvalidArgument("--cluster", address, "no Ray cluster answers there",
                                          "Start one (ray start --head) or pass its ray://HOST:PORT.") from None
                # none running here: a local one, as a campaign's own
                ray.init(log_to_driver=False, include_dashboard=False, logging_level="ERROR")
        self.queue = Queue()
        self.workers: list[Worker] = []
        self.done: dict = {}  # a worker's wait() reference -> the worker
        self.exit_codes: dict[int, int | None] = {}

    def start(self, child, payloads: list, name: str) -> list[Worker]:
        gpu = str(self.device).startswith("cuda")
        node = _node_class(self.ray).options(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1)
        actors = [node.remote() for _ in payloads]
        # Each child started before anything waits on it (an actor runs its calls side by side).
        self.ray.get([a.start.remote(child, i, p, self.queue) for i, (a, p) in enumerate(zip(actors, payloads))])
        for index, actor in enumerate(actors):
            worker = Worker(index, channel=None, gpu="ray" if gpu else None, process=actor)
            self.done[actor.wait.remote()] = worker
            self.workers.append(worker)
        return list(self.workers)

    def events(self, on_tick=None):
        """What the workers send as ``(worker, message)``, then ``(worker, Ended())`` for each once its messages
        are all read; a worker whose node or actor died ends where its last message did."""
        from queue import Empty  # noqa: PLC0415 -- what Ray's queue raises on a timeout, read only here

        ended: set[int] = set()
        while len(ended) < len(self.workers):
            if on_tick is not None:
                on_tick()
            try:
                index, data = self.queue.get(timeout=_POLL_S)
            except Empty:
                yield from self._lost(ended)
                continue
            worker = self.workers[index]
            if data is None:
                ended.add(index)
                self._exit_code(worker)
                yield worker, Ended()
            elif index not in ended:
                yield worker, pickle.loads(data)

    def _exit_code(self, worker: Worker) -> None:
        """Its child's exit code once the relay has ended, -9 where the actor or its node died."""
        ref = next(r for r, w in self.done.items() if w is worker)
        try:
            self.exit_codes[worker.index] = self.ray.get(ref, timeout=30)
        except self.ray.exceptions.RayError:
            self.exit_codes[worker.index] = -9

    def _lost(self, ended: set):
        """An Ended for each worker whose actor died before its relay said so (its node is gone)."""
        pending = [r for r, w in self.done.items() if w.index not in ended]
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in ready:
            worker = self.done[ref]
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError:  # the actor or its node died: no relay to say so
                self.exit_codes[worker.index] = -9
                ended.add(worker.index)
                yield worker, Ended()

    def pids(self, worker: Worker) -> tuple[int, int]:
        """(its actor's process, its child's), on the node that runs it."""
        return self.ray.get(worker.process.pids.remote())

    def alive(self, worker: Worker) -> bool:
        return worker.index not in self.exit_codes

    def exitcode(self, worker: Worker) -> int | None:
        return self.exit_codes.get(worker.index)

    def terminate(self, worker: Worker) -> None:
        self._signal(worker, kill=False)

    def kill(self, worker: Worker) -> None:
        self._signal(worker, kill=True)

    def _signal(self, worker: Worker, kill: bool) -> None:
        if self.alive(worker):
            worker.process.signal.remote(kill)

    def end(self) -> None:
        """Every actor gone (its child with it), the queue too."""
        for worker in self.workers:
            self.ray.kill(worker.process, no_restart=True)
        self.ray.kill(self.queue.actor, no_restart=True)
