"""A Ray cluster of separate processes on this host, for the tests: a head with no CPU of its own and worker nodes
of one CPU each, as ``ray start`` makes them on GPU hosts, on loopback with a temporary folder of their own.

Each node is one ``ray start --block`` in a process group of its own: a test kills a whole node (its raylet, its
agents, the actors it runs and their workers) with one SIGKILL to its group, and the teardown ends exactly the
processes this module started, never another Ray on the host (no ``ray stop``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from flashcheck.campaign.messages import Message

START_TIMEOUT_S = 60.0
# Token authentication off: the nodes, the campaigns' drivers and this process agree without a token file.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environment() -> dict:
    """This process's environment for the nodes and the campaigns' drivers: its import path made absolute (they start
    elsewhere), token authentication off."""
    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, **RAY_ENV, "PYTHONPATH": os.pathsep.join(paths)}


@dataclass(eq=False)
class RayNode:
    """One node: its ``ray start --block`` process, the leader of the node's process group."""

    process: subprocess.Popen
    log: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def holds(self, pid: int) -> bool:
        """Whether process ``pid`` runs on this node: it or a parent of it (an actor's raylet) is in the node's
        group (the raylet starts each actor in a group of its own)."""
        while pid > 1:
            try:
                if os.getpgid(pid) == self.process.pid:
                    return True
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
        return False

    def kill(self) -> None:
        """SIGKILL to every process of the node at once, as a machine that loses power."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)


@dataclass(eq=False)
class LocalRayCluster:
    """A head (no CPU) and worker nodes (one CPU each) at ``address``."""

    folder: Path
    port: int = field(default_factory=_free_port)
    head: RayNode | None = None
    workers: list = field(default_factory=list)
    started: int = 0  # worker nodes started so far

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, workers: int) -> "LocalRayCluster":
        self.head = self._node("--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port), "--num-cpus", "0",
                               "--include-dashboard", "false")
        for _ in range(workers):
            self.add_worker()
        return self

    def add_worker(self) -> RayNode:
        """One more node of one CPU, at an address of its own on loopback (127.0.0.2, ...), as a host of its own has:
        a driver on this host joins the head, never a worker node a test may kill. Started one at a time, as two
        nodes starting at once can take the same port."""
        self.started += 1
        node = self._node("--address", self.address, "--num-cpus", "1",
                          "--node-ip-address", f"127.0.0.{self.started + 1}")
        self.workers.append(node)
        return node

    def heal(self, workers: int) -> None:
        """``workers`` worker nodes up: fresh ones in place of those a test killed."""
        self.workers = [n for n in self.workers if n.alive]
        while len(self.workers) < workers:
            self.add_worker()

    def node_of(self, pid: int) -> RayNode | None:
        return next((n for n in self.workers if n.holds(pid)), None)

    def _node(self, *options: str) -> RayNode:
        log = self.folder / f"node{self.started if self.head else 0}.log"
        command = [str(Path(sys.executable).parent / "ray"), "start", *options, "--block", "--temp-dir",
                   str(self.folder / "ray"), "--object-store-memory", str(100 * 2**20), "--include-log-monitor",
                   "false", "--disable-usage-stats"]
        with open(log, "w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environment(),
                                       start_new_session=True)
        node = RayNode(process, log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while "Ray runtime started" not in log.read_text():
            if not node.alive or time.monotonic() > deadline:
                node.kill()
                raise RuntimeError(f"a Ray node did not start: {log.read_text()[-2000:]}")
            time.sleep(0.1)
        return node

    def stop(self) -> None:
        for node in [*self.workers, self.head]:
            if node is not None:
                node.kill()
        shutil.rmtree(self.folder, ignore_errors=True)


def local_cluster(workers: int = 2) -> LocalRayCluster:
    """A started cluster in a short temporary folder (Ray's socket paths must stay under 108 characters)."""
    cluster = LocalRayCluster(Path(tempfile.mkdtemp(prefix="fc-ray-")))
    try:
        return cluster.start(workers)
    except BaseException:
        cluster.stop()
        raise


@dataclass(frozen=True)
class Said(Message):
    """What a test's worker sends first."""

    index: int


def says_then_waits(channel, index: int, hold: bool) -> None:
    """A test's worker (light to import, unlike a campaign's): it says so, then holds its CPU for a minute, or not."""
    from flashcheck.campaign.transport import child_setup

    child_setup()  # as a campaign's worker: it dies with the actor that started it
    channel.send(Said(index))
    time.sleep(60 if hold else 0)
