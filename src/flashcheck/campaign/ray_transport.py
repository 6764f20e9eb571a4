"""Workers on a Ray cluster: a :class:`flashcheck.campaign.scheduler.Transport` whose workers run on the
cluster's nodes (``fuzz``, ``signoff`` and ``selftest`` with ``--cluster``).

Each worker is a Ray actor (:class:`_Node`) with its resources declared (one GPU on a GPU campaign, which Ray
grants through ``CUDA_VISIBLE_DEVICES``; one CPU otherwise). On its node the actor starts the worker as
``--jobs`` does on this host (:class:`~flashcheck.campaign.transport.ProcessTransport`: a "spawn" child with its
channel), and relays every message the child sends, as the child pickled it, into one queue on the driver's node
(a Ray queue actor that takes no CPU). What the driver sends a worker goes the other way through an actor method
that writes it to the child's channel, one message at a time and in order. The policies see the same workers and
messages as with ``--jobs``: the seeds, the corpus and the example database are the campaign's (a corpus every
node reaches, a Redis example database).

A worker's end is its channel's end: the child exited, was killed, or its node died (the actor's relay then
fails, which the driver sees as the worker's end). What it reported before is kept, as with ``--jobs``. A policy
may then start a worker in its place (:meth:`RayTransport.replace`): a new actor, on whichever node Ray finds with
the resources free, or on none if Ray places it nowhere within :data:`PLACE_WAIT_S`.

Ray is an optional dependency: ``pip install 'flashcheck[ray]'``.
"""

from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import pickle
import threading

from ..errors import InvalidArgument
from .messages import Ended, Message
from .transport import Channel, ProcessTransport, Worker, channel_pair, pickled
from .worker_deaths import exit_text

__all__ = ["PLACE_WAIT_S", "RayTransport", "check_cluster", "make_transport"]

_POLL_S = 0.25
PLACE_WAIT_S = 10.0  # how long a worker in place of a lost one waits for a node with its resources free
_START_S = 120.0     # how long a placed actor may take to start its worker
_INSTALL = "pip install 'flashcheck[ray]' (Ray 2.60 or later), or run without --cluster."
_FORMS = ("Pass --cluster ray (this host's cluster, or a new local one), --cluster HOST:PORT (the head's address, "
          "as `ray start --address` takes it) or --cluster ray://HOST:PORT (Ray Client).")


def check_cluster(value: str | None) -> str | None:
    """The Ray address of ``--cluster`` (``"ray"``: this host's cluster or a new local one; ``HOST:PORT``: the
    cluster whose head listens there; ``ray://HOST:PORT``: that cluster through Ray Client), or None without it;
    exit 2 where Ray is missing or the value is none of these."""
    if value is None:
        return None
    if value != "ray" and not value.startswith("ray://") and not _host_port(value):
        raise InvalidArgument("--cluster", value, "not a Ray cluster", _FORMS)
    if importlib.util.find_spec("ray") is None:
        raise InvalidArgument("--cluster", value, "Ray is not installed", _INSTALL)
    return "auto" if value == "ray" else value


def make_transport(device: str, cluster: str | None):
    """The transport of a policy's workers: processes of this host, or actors of the Ray ``cluster`` (the address
    :func:`check_cluster` gives)."""
    return ProcessTransport(device) if cluster is None else RayTransport(device, cluster)


def _host_port(value: str) -> bool:
    host, _, port = value.rpartition(":")
    return bool(host) and "/" not in host and port.isdigit() and 0 < int(port) < 65536


class _Relay:
    """A worker on its node: its child process and the thread that forwards what the child sends."""

    def __init__(self, child, slot: int, index: int, payload, queue):
        self.channel, child_end = channel_pair()
        # Ray set the actor's GPU and thread counts in its environment: the child inherits them.
        self.process = mp.get_context("spawn").Process(target=child, args=(child_end, index, payload),
                                                       name=f"flashcheck-ray-{index}")
        self.process.start()
        child_end.close()
        self.thread = threading.Thread(target=self._forward, args=(slot, queue), daemon=True)
        self.thread.start()

    def _forward(self, slot: int, queue) -> None:
        while True:
            try:
                data = self.channel.receive_pickled()
            except (EOFError, OSError):
                break
            queue.put((slot, data))
        self.process.join()
        queue.put((slot, None))  # the channel closed: everything the child sent is in the queue before this


def _node_class(ray):
    # "inbox" runs one call at a time, so that the driver's messages reach the child in the order it sent them.
    @ray.remote(max_concurrency=4, concurrency_groups={"inbox": 1})
    class _Node:
        """One worker's actor: its child and relay on the node Ray placed it on."""

        def start(self, child, slot: int, index: int, payload, queue) -> str:
            """Start the worker; the node it runs on."""
            self.relay = _Relay(child, slot, index, payload, queue)
            return ray.get_runtime_context().get_node_id()

        @ray.method(concurrency_group="inbox")
        def deliver(self, data: bytes) -> None:
            try:
                self.relay.channel.send_pickled(data)
            except OSError:
                pass  # the child is gone: its end reaches the driver through the queue

        def wait(self) -> int | None:
            """Returns once the worker's messages are all in the queue: its exit code."""
            self.relay.thread.join()
            return self.relay.process.exitcode

        def pids(self) -> tuple[int, int]:
            """(this actor's process, its worker's child): what a node's own tools see."""
            import os  # noqa: PLC0415 -- on the node, where the actor runs

            return os.getpid(), self.relay.process.pid

        def signal(self, kill: bool) -> None:
            (self.relay.process.kill if kill else self.relay.process.terminate)()

    return _Node


class RayTransport:
    """Workers as Ray actors on the cluster at ``address`` (``"auto"``: this host's, or a new local one)."""

    replaces = True

    def __init__(self, device: str, address: str, place_wait_s: float = PLACE_WAIT_S):
        import ray  # noqa: PLC0415 -- the optional dependency, only with --cluster

        self.ray, self.device, self.place_wait_s = ray, device, place_wait_s
        _connect(ray, address)
        self.queue = _driver_queue(ray)
        gpu = str(device).startswith("cuda")
        self.actor_class = _node_class(ray)
        self.resources = {"GPU": 1} if gpu else {"CPU": 1}
        self.options = dict(num_gpus=1 if gpu else 0, num_cpus=0 if gpu else 1, runtime_env={"env_vars": _forwarded()})
        self.gpu = "ray" if gpu else None
        self.groups: dict[Worker, object] = {}  # a replacing worker's placement group: its resources, held for it
        self.child = None
        self.workers: list[Worker] = []
        self.slots: dict[int, Worker] = {}  # the number a worker's relay tags its messages with -> the worker
        self.next_slot = 0
        self.done: dict = {}  # a worker's wait() reference -> the worker
        self.exit_codes: dict[Worker, int | None] = {}
        self.lost: dict[Worker, str] = {}  # workers whose actor or node died: Ray's word for it

    def start(self, child, payloads: list, name: str) -> list[Worker]:
        self.child = child
        actors = [self.actor_class.options(**self.options).remote() for _ in payloads]
        slots = [self._slot() for _ in payloads]
        # Each child started before anything waits on it (an actor runs its calls side by side).
        nodes = self.ray.get([a.start.remote(child, s, i, p, self.queue)
                              for i, (a, s, p) in enumerate(zip(actors, slots, payloads))])
        return [self._add(i, a, s, n) for i, (a, s, n) in enumerate(zip(actors, slots, nodes))]

    def replace(self, worker: Worker, payload) -> Worker | None:
        """A new actor running ``payload`` as worker ``worker.index`` (the old actor's resources freed first), on
        any node where Ray finds them free within ``place_wait_s``; None where it finds none."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415 -- as ray

        self._drop(worker)
        # A placement group says when the resources are held, apart from the seconds the actor takes to start.
        group = self.ray.util.placement_group([self.resources])
        placed, _ = self.ray.wait([group.ready()], timeout=self.place_wait_s)
        actor, slot, node = None, self._slot(), None
        if placed:
            actor = self.actor_class.options(**self.options, scheduling_strategy=PlacementGroupSchedulingStrategy(
                group)).remote()
            try:
                node = self.ray.get(actor.start.remote(self.child, slot, worker.index, payload, self.queue),
                                    timeout=_START_S)
            except (self.ray.exceptions.RayError, self.ray.exceptions.GetTimeoutError):  # its node died meanwhile
                node = None
        if node is None:
            if actor is not None:
                self.ray.kill(actor, no_restart=True)
            self.ray.util.remove_placement_group(group)
            return None
        replacement = self._add(worker.index, actor, slot, node)
        self.groups[replacement] = group
        return replacement

    def _drop(self, worker: Worker) -> None:
        """Its actor gone (its child with it), and the resources held for it."""
        self.ray.kill(worker.process, no_restart=True)
        group = self.groups.pop(worker, None)
        if group is not None:
            self.ray.util.remove_placement_group(group)

    def _slot(self) -> int:
        self.next_slot += 1
        return self.next_slot - 1

    def _add(self, index: int, actor, slot: int, node: str) -> Worker:
        worker = Worker(index, channel=None, gpu=self.gpu, process=actor, node=node)
        self.slots[slot] = worker
        self.done[actor.wait.remote()] = worker
        self.workers.append(worker)
        return worker

    def send(self, worker: Worker, message: Message) -> None:
        """``message`` to ``worker``'s child through its actor; nothing where the worker is gone (its end comes)."""
        if self.alive(worker):
            worker.process.deliver.remote(pickled(message))

    def events(self, on_tick=None):
        """What the workers send as ``(worker, message)``, then ``(worker, Ended())`` for each once its messages
        are all read; a worker whose node or actor died ends where its last message did. A worker started by
        :meth:`replace` meanwhile is waited for too."""
        from queue import Empty  # noqa: PLC0415 -- what Ray's queue raises on a timeout, read only here

        ended: set = set()
        while any(w not in ended for w in self.workers):
            if on_tick is not None:
                on_tick()
            try:
                slot, data = self.queue.get(timeout=_POLL_S)
            except Empty:
                yield from self._lost(ended)
                continue
            worker = self.slots.get(slot)
            if worker is None or worker in ended:
                continue
            if data is None:
                ended.add(worker)
                self._exit_code(worker)
                yield worker, Ended()
            else:
                yield worker, pickle.loads(data)

    def _exit_code(self, worker: Worker) -> None:
        """Its child's exit code once the relay has ended; the actor's loss where the actor or its node died."""
        ref = next(r for r, w in self.done.items() if w is worker)
        try:
            self.exit_codes[worker] = self.ray.get(ref, timeout=30)
        except self.ray.exceptions.RayError as exc:
            self._lose(worker, exc)

    def _lose(self, worker: Worker, exc: Exception) -> None:
        self.exit_codes[worker] = None
        self.lost[worker] = f"its actor or its node was lost ({type(exc).__name__})"

    def _lost(self, ended: set):
        """An Ended for each worker whose actor died before its relay said so (its node is gone)."""
        pending = [r for r, w in self.done.items() if w not in ended]
        ready, _ = self.ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in ready:
            worker = self.done[ref]
            try:
                self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:  # the actor or its node died: no relay to say so
                self._lose(worker, exc)
                ended.add(worker)
                yield worker, Ended()

    def pids(self, worker: Worker) -> tuple[int, int]:
        """(its actor's process, its child's), on the node that runs it."""
        return self.ray.get(worker.process.pids.remote())

    def alive(self, worker: Worker) -> bool:
        return worker not in self.exit_codes

    def exitcode(self, worker: Worker) -> int | None:
        return self.exit_codes.get(worker)

    def how_ended(self, worker: Worker) -> str:
        return self.lost.get(worker) or exit_text(self.exitcode(worker))

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
            self._drop(worker)
        self.ray.kill(self.queue.actor, no_restart=True)


def _forwarded() -> dict:
    """What this command set for its workers, as ``--jobs`` workers inherit it: every ``FLASHCHECK_`` variable
    (``FLASHCHECK_DRAW``, ...) and the Triton interpreter's switch (``--device cpu``); a node's own environment
    gives the rest."""
    return {k: v for k, v in os.environ.items() if k.startswith("FLASHCHECK_") or k == "TRITON_INTERPRET"}


def _connect(ray, address: str) -> None:
    """This process joined to the cluster at ``address``. ``"auto"``: ``RAY_ADDRESS``, else the cluster ``ray start``
    last started on this host, else a new local one; never a cluster Ray would find only by its processes running
    here (another user's, another program's own local one)."""
    if ray.is_initialized():
        return
    options = dict(log_to_driver=False, include_dashboard=False, logging_level="ERROR")
    try:
        ray.init(address=None if address == "auto" else address, **options)
    except ConnectionError:
        if address != "auto":
            raise InvalidArgument("--cluster", address, "no Ray cluster answers there",
                                  "Start one (ray start --head) or pass its HOST:PORT or ray://HOST:PORT.") from None
        ray.init(address="local", **options)  # the cluster ray start left here has gone: a local one


def _driver_queue(ray):
    """The queue every relay writes to: on the driver's node, taking no CPU, so that no other node's loss takes it
    (Ray places one that only prefers the driver's node on other nodes as well)."""
    from ray.util.queue import Queue  # noqa: PLC0415 -- as ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: PLC0415 -- as ray

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
