"""Campaigns on a Ray cluster of separate processes (tests/robustness/_ray_nodes.py: a head with no CPU and two
worker nodes of one CPU each on this host, started once for the module, as ``ray start`` starts them on GPU hosts).

``fuzz --cluster HOST:PORT`` draws the cases ``--jobs`` draws and finds the same bugs; a worker's process killed, a
node killed whole and the driver killed mid-campaign lose nothing that was reported: the lost shares go on in
workers placed on the nodes that have room, and the same command run again resumes the campaign, judging no case
twice. ``signoff`` and ``selftest`` run there too. Without Ray, --cluster exits 2 saying what to install. Skipped
where Ray is not installed (pip install 'flashcheck[ray]')."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from flashcheck.campaign.messages import Ended
from flashcheck.cli import main

from ._kernels import GATE_FILE
from ._ray_nodes import RAY_ENV, Said, environment, local_cluster, says_then_waits
from ._run import K, fuzz
from .test_interrupt import ROOT, _command, _wait_for

ray_installed = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="Ray is not installed")


@pytest.fixture(scope="module")
def cluster():
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray is not installed (pip install 'flashcheck[ray]')")
    import ray

    nodes = local_cluster(workers=2)
    with pytest.MonkeyPatch.context() as patch:
        for name, value in RAY_ENV.items():
            patch.setenv(name, value)
        try:  # this process's campaigns join it (a process joins one cluster)
            ray.init(address=nodes.address, log_to_driver=False, logging_level="ERROR")
            yield nodes
        finally:
            ray.shutdown()
            nodes.stop()


@pytest.fixture
def nodes(cluster):
    """The module's cluster with two worker nodes up: fresh ones in place of those an earlier test killed."""
    cluster.heal(workers=2)
    return cluster


def _saved(corpus: Path) -> set:
    return {str(p) for p in corpus.glob("*.json")}


def _paths(summary: dict) -> set:
    return {f["path"] for f in summary["findings"]}


def test_a_cluster_campaign_draws_what_jobs_draws_and_finds_the_same_bugs(tmp_path, nodes):
    extra = ("--keep-going", "--max-examples", "8", "--jobs", "2")
    code_jobs, jobs = fuzz(tmp_path, "assumes_contiguous", *extra, seed=3, name="jobs")
    code_ray, ray = fuzz(tmp_path, "assumes_contiguous", *extra, "--cluster", nodes.address, seed=3, name="ray")
    assert code_jobs == code_ray == 1
    assert [s["case_log_sha256"] for s in ray["sources"]] == [s["case_log_sha256"] for s in jobs["sources"]]
    assert {b["cause"] for b in ray["bugs"]} == {b["cause"] for b in jobs["bugs"]} and ray["bugs"]
    assert ray["coverage"] == jobs["coverage"] and ray["cases"] == jobs["cases"]
    # each worker on a node of its own (one CPU each, none on the head), where --jobs names no node
    assert len({s["node"] for s in ray["sources"]}) == 2 and not any("node" in s for s in jobs["sources"])


def test_signoff_runs_its_campaigns_on_the_cluster(tmp_path, nodes):
    code = main(["signoff", "torch:math", "--device", "cpu", "--preset", "smoke", "--dtype", "fp32",
                 "--max-examples", "6", "--min-cases", "3", "--seed", "1", "--jobs", "1", "--cluster", nodes.address,
                 "--out", str(tmp_path)])
    report = json.loads((tmp_path / "report.json").read_text())
    campaign = json.loads((tmp_path / "campaigns" / "torch-math-forward.json").read_text())
    assert code == 0 and report["status"] == "SIGNED-OFF" and campaign["cases"] >= 6
    assert [s["source"] for s in campaign["sources"]] == ["worker0"] and campaign["sources"][0]["node"]


def test_selftest_runs_its_rows_on_the_cluster_and_gives_the_rows_of_one_process(tmp_path, nodes):
    args = ["selftest", "--device", "cpu", "--dtype", "fp32", "--cases", "4", "--max-n", "24",
            "--variant", "torch:math"]
    rows = []
    for extra in (["--jobs", "1"], ["--jobs", "1", "--chunk", "2", "--cluster", nodes.address]):
        path = tmp_path / f"{len(rows)}.json"
        assert main(args + extra + ["--json", str(path)]) == 0
        rows.append([{**r, "seconds": None} for r in json.loads(path.read_text())])
    assert rows[0] == rows[1] and rows[0][0]["cases"] == 4


def _children(nodes) -> list[int]:
    """The campaign workers on the cluster's nodes: the processes its actors spawned."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            spawned = b"spawn_main" in (entry / "cmdline").read_bytes()
            under_actor = Path(f"/proc/{parent}/cmdline").read_bytes().startswith(b"ray::")
        except (OSError, ValueError, IndexError):
            continue
        if spawned and under_actor and nodes.node_of(int(entry.name)) is not None:
            found.append(int(entry.name))
    return sorted(found)


def _drawn(corpus: Path) -> list:
    """Every drawn case the campaign's progress record holds, each run's."""
    return [json.loads(line)["drawn"] for log in sorted(corpus.glob(".progress/*/worker*.log"))
            for line in log.read_text().splitlines() if '"drawn"' in line]


def test_a_campaign_loses_nothing_to_a_worker_a_node_or_its_driver_killed_and_judges_no_case_twice(tmp_path, nodes):
    corpus, out, gate = tmp_path / "corpus", tmp_path / "s.json", tmp_path / "gate"
    command = _command() + ["fuzz", f"{K}:gated_crash", "--device", "cpu", "--preset", "smoke", "--seed", "1",
                            "--jobs", "2", "--keep-going", "--max-examples", "8", "--cluster", nodes.address,
                            "--corpus", str(corpus), "--json", str(out), "--no-progress"]
    env = {**environment(), GATE_FILE: str(gate)}

    def start():
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    driver = start()
    _wait_for(lambda: any(corpus.glob("*-found-*.json")) and len(_children(nodes)) == 2, "a saved finding", driver)
    gate.touch()  # every worker holds at its next call of the kernel
    time.sleep(0.5)  # a finding saved before now is reported too
    reported = _saved(corpus)
    one, other = _children(nodes)
    os.kill(one, signal.SIGKILL)  # a worker's process
    nodes.node_of(other).kill()  # and another worker's node, every process of it
    nodes.add_worker()  # room for the second worker's share
    losses = corpus / ".progress"
    _wait_for(lambda: sum(len(f.read_text().splitlines()) for f in losses.glob("*/lost.log")) == 2,
              "two workers in the lost ones' place", driver)
    driver.kill()  # and the driver: the same command resumes the campaign
    driver.wait()
    drawn_before = _drawn(corpus)
    gate.unlink()
    driver = start()
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 1 and "Traceback" not in stderr, (stdout, stderr)
    summary = json.loads(out.read_text())
    assert reported <= _paths(summary) <= _saved(corpus)
    drawn = _drawn(corpus)
    assert set(drawn_before) <= set(drawn)  # the first driver's runs, kept
    assert len(drawn) == len(set(drawn)) == 8, drawn  # every share's cases, each drawn once
    lost = {entry["worker"]: entry for entry in summary["lost"]}
    first = [lost.pop("worker0"), lost.pop("worker1")]  # as the first driver saw them
    assert [e["restarted_as"] for e in first] == ["worker0.1", "worker1.1"]
    assert sorted(e["ended"].split(" (")[0] for e in first) == [
        "its actor or its node was lost", "killed by signal SIGKILL, maybe by the system's out-of-memory killer"]
    assert all("earlier run" in e["ended"] for e in lost.values())  # those the driver's death took, if they ran
    sources = {s["source"]: s for s in summary["sources"]}
    finished = [name for name, s in sources.items() if s["exit"] is None]
    assert len(finished) == 2 and all(e["restarted_as"] in sources for e in [*first, *lost.values()])
    assert "lost: worker0 after" in stdout and "left went to worker0.1" in stdout


def test_a_worker_killed_ends_after_what_it_sent_and_one_that_finds_no_room_in_its_wait_goes_to_nobody(nodes):
    import ray

    from flashcheck.campaign.ray_transport import RayTransport

    transport = RayTransport("cpu", nodes.address, place_wait_s=0.0)  # no wait: no room in time
    one, other = transport.start(says_then_waits, [True, True], "test")  # each holds its node's CPU
    said, replaced = set(), []
    try:
        for worker, message in transport.events():
            if isinstance(message, Said):
                said.add(worker)
                if said == {one, other}:  # both reported: kill one's process where it runs
                    os.kill(transport.pids(one)[1], signal.SIGKILL)
            elif isinstance(message, Ended) and worker is one:
                replaced.append(transport.replace(one, False))
                transport.kill(other)
    finally:
        transport.end()
    assert replaced == [None] and transport.workers == [one, other]
    assert transport.how_ended(one) == transport.how_ended(other) == \
        "killed by signal SIGKILL, maybe by the system's out-of-memory killer"
    assert {g["state"] for g in ray.util.placement_group_table().values()} <= {"REMOVED"}  # no CPU held for nobody


@pytest.mark.parametrize("command", [["fuzz", "torch:math", "--max-examples", "1"],
                                     ["signoff", "torch:math", "--max-examples", "1", "--out", "OUT"],
                                     ["selftest", "--cases", "1"]])
def test_without_ray_cluster_exits_2_saying_what_to_install(tmp_path, capsys, monkeypatch, command):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else object())
    code = main([c.replace("OUT", str(tmp_path)) for c in command] + ["--device", "cpu", "--cluster", "ray"])
    err = capsys.readouterr().err
    assert code == 2 and "--cluster" in err and "pip install 'flashcheck[ray]'" in err


@pytest.mark.parametrize("value", ["dask://host:1", "host", "host:port", "host:0"])
def test_a_cluster_that_is_not_ray_is_refused_with_how_to_name_one(tmp_path, capsys, value):
    code = main(["fuzz", "torch:math", "--device", "cpu", "--cluster", value, "--max-examples", "1",
                 "--corpus", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and value in err and "--cluster HOST:PORT" in err and "--cluster ray://HOST:PORT" in err


@ray_installed
def test_a_head_s_address_is_a_cluster():
    from flashcheck.campaign.ray_transport import check_cluster

    assert [check_cluster(v) for v in ("ray", "10.0.0.1:6379", "ray://head:10001")] == [
        "auto", "10.0.0.1:6379", "ray://head:10001"]
