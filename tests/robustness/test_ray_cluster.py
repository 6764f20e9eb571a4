"""``fuzz --cluster ray``: the ``--jobs`` workers as actors of a local Ray cluster give the same cases, distinct bugs
and coverage as ``--jobs`` on this host with the same seed; a worker's child killed with SIGKILL, or its actor's
whole process, ends that worker after what it sent, which is kept; without Ray, --cluster exits 2 saying what to
install. Skipped where Ray is not installed (pip install 'flashcheck[ray]')."""

from __future__ import annotations

import importlib.util
import os
import signal
import time
from dataclasses import dataclass

import pytest

from flashcheck.campaign.messages import Ended, Message
from flashcheck.cli import main

from ._run import fuzz

ray_installed = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


@ray_installed
def test_a_cluster_campaign_draws_what_jobs_draws_and_finds_the_same_bugs(tmp_path):
    extra = ("--keep-going", "--max-examples", "40", "--jobs", "2")
    code_jobs, jobs = fuzz(tmp_path, "assumes_contiguous", *extra, seed=3, name="jobs")
    code_ray, ray = fuzz(tmp_path, "assumes_contiguous", *extra, "--cluster", "ray", seed=3, name="ray")
    assert code_jobs == code_ray == 1
    assert [s["case_log_sha256"] for s in ray["sources"]] == [s["case_log_sha256"] for s in jobs["sources"]]
    assert {b["cause"] for b in ray["bugs"]} == {b["cause"] for b in jobs["bugs"]} and len(ray["bugs"]) == 2
    assert ray["coverage"] == jobs["coverage"] and ray["cases"] == jobs["cases"]


@dataclass(frozen=True)
class _Said(Message):
    """What a test's worker sent before it waited to be killed."""

    index: int


def _says_then_waits(channel, index: int, payload) -> None:
    from flashcheck.campaign.transport import child_setup

    child_setup()  # as a campaign's worker: it dies with the actor that started it
    channel.send(_Said(index))
    time.sleep(60 if payload else 0)


@ray_installed
@pytest.mark.parametrize("victim", ["child", "actor"])
def test_a_worker_killed_on_its_node_ends_after_what_it_sent(victim):
    from flashcheck.campaign.ray_transport import RayTransport

    transport = RayTransport("cpu", "auto")
    workers = transport.start(_says_then_waits, [True, False], "test")
    seen, ended = [], []
    try:
        for worker, message in transport.events():
            if isinstance(message, _Said):
                seen.append(message.index)
                if message.index == 0:  # worker 0 has reported: kill it where it runs
                    actor_pid, child_pid = transport.pids(worker)
                    os.kill(child_pid if victim == "child" else actor_pid, signal.SIGKILL)
            elif isinstance(message, Ended):
                ended.append(worker.index)
    finally:
        transport.end()
    assert sorted(seen) == [0, 1] and sorted(ended) == [0, 1]
    assert transport.exitcode(workers[0]) == -signal.SIGKILL and transport.exitcode(workers[1]) == 0


def test_without_ray_cluster_exits_2_saying_what_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else object())
    code = main(["fuzz", "torch:math", "--device", "cpu", "--cluster", "ray", "--max-examples", "1",
                 "--corpus", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--cluster" in err and "pip install 'flashcheck[ray]'" in err


def test_a_cluster_that_is_not_ray_is_refused_with_how_to_name_one(tmp_path, capsys):
    code = main(["fuzz", "torch:math", "--device", "cpu", "--cluster", "dask://host:1", "--max-examples", "1",
                 "--corpus", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "dask://host:1" in err and "--cluster ray://HOST:PORT" in err
