"""``fuzz --jobs N``: N worker processes, one corpus, one merged summary; nothing found is lost when the
campaign is interrupted or a worker is killed; the same seed and N give the same cases per worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from flashcheck import AttentionCase
from flashcheck.campaign import transport
from flashcheck.campaign.messages import Message

from ._kernels import CALLS_FILE
from ._run import K, fuzz
from .test_interrupt import ROOT, _command, _wait_for


def _paths(summary) -> set:
    return {f["path"] for f in summary["findings"]}


def _saved(corpus: Path) -> set:
    return {str(p) for p in corpus.glob("*.json")}


def test_every_workers_findings_are_saved_and_merged_into_one_summary(tmp_path, capsys):
    # What is tested is the merge: the seed is one whose two workers each find a bug, one of each kind, in
    # their 8 cases (how often a campaign finds both bugs is measured per seed, not here).
    code, summary = fuzz(tmp_path, "two_bugs", "--jobs", "2", "--keep-going", "--max-examples", "16", seed=2)
    assert code == 1 and summary["verdict"] == "BUG" and summary["jobs"] == 2
    workers = summary["sources"]
    assert [w["source"] for w in workers] == ["worker0", "worker1"]
    assert len({w["seed"] for w in workers}) == 2 and summary["seed"] == 2
    for key in ("cases", "examples", "findings"):
        assert sum(w[key] for w in workers) == (len(summary[key]) if key == "findings" else summary[key])
    assert summary["examples"] == 16 and [w["examples"] for w in workers] == [8, 8]
    for w in workers:  # each worker found a bug, saved it as found and shrunk
        mine = [f for f in summary["findings"] if f["source"] == w["source"]]
        assert {f["shrunk"] for f in mine} == {False, True} and w["verdict"] == "BUG", mine
    assert {f["kinds"][0] for f in summary["findings"] if f["shrunk"]} == {"crash", "over_budget"}
    assert _paths(summary) == _saved(tmp_path / "run-corpus")  # one corpus, every saved case reported
    for path in _paths(summary):
        AttentionCase.load(path)
    out = capsys.readouterr().out
    assert "worker0: BUG" in out and "worker1: BUG" in out


def test_the_same_seed_and_jobs_give_the_same_cases_per_worker(tmp_path):
    # The second run shares the first one's corpus and example database: a seed still fixes the cases.
    runs = [fuzz(tmp_path, "two_bugs", "--jobs", "2", "--max-examples", "8", seed=11, name="a")[1] for _ in range(2)]
    hashes = [[w["case_log_sha256"] for w in run["sources"]] for run in runs]
    assert hashes[0] == hashes[1] and len(set(hashes[0])) == 2, hashes
    assert [w["cases"] for w in runs[0]["sources"]] == [w["cases"] for w in runs[1]["sources"]]
    other = fuzz(tmp_path, "two_bugs", "--jobs", "2", "--max-examples", "8", seed=12, name="b")[1]
    assert not {w["case_log_sha256"] for w in other["sources"]} & set(hashes[0])


def _start(tmp_path, kernel: str, *extra) -> tuple:
    corpus, summary_path, calls = tmp_path / "corpus", tmp_path / "summary.json", tmp_path / "calls"
    proc = subprocess.Popen(
        _command() + ["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", "1", "--jobs", "2",
                      "--max-examples", "1000", "--corpus", str(corpus), "--json", str(summary_path), "--no-progress",
                      *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": "", CALLS_FILE: str(calls)})
    return proc, corpus, summary_path


def _workers(pid: int) -> list[int]:
    """The campaign's worker processes: the parent's spawned children (Linux /proc)."""
    children = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children |= {int(c) for c in (task / "children").read_text().split()}
    return sorted(c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes())


def test_ctrl_c_writes_the_merged_summary_and_keeps_every_saved_finding(tmp_path):
    proc, corpus, summary_path = _start(tmp_path, "slow_bug")
    _wait_for(lambda: any(corpus.glob("*-found-*.json")), "saved finding", proc)
    proc.send_signal(signal.SIGINT)  # the parent alone: it tells the workers
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    summary = json.loads(summary_path.read_text())
    assert summary["stopped"] == "interrupted" and summary["verdict"] == "BUG" and summary["jobs"] == 2
    assert all(w["stopped"] == "interrupted" and w["exit"] is None for w in summary["sources"])
    assert _paths(summary) == _saved(corpus)
    assert "stopped: interrupted" in out and "Traceback" not in err, err


def test_a_worker_killed_mid_campaign_keeps_the_findings_it_reported(tmp_path):
    proc, corpus, summary_path = _start(tmp_path, "slow_bug", "--keep-going")
    _wait_for(lambda: any(corpus.glob("*-found-*.json")), "saved finding", proc)
    time.sleep(0.5)  # a case saved now has been reported too
    saved = _saved(corpus)
    workers = _workers(proc.pid)
    assert len(workers) == 2, workers
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, (out, err)
    summary = json.loads(summary_path.read_text())
    assert summary["verdict"] == "BUG" and saved <= _paths(summary)
    for w in summary["sources"]:
        assert w["stopped"] == "worker_died" and "SIGKILL" in w["exit"], w
    assert any("without a summary" in note for note in summary["notes"])
    # the distinct bugs still hold what the killed workers found, with a case to replay and its dtype
    bugs = summary["bugs"]
    assert bugs and {f["cause"] for f in summary["findings"]} == {b["cause"] for b in bugs}
    assert all(b["smallest"]["path"] in _paths(summary) and b["dtypes"] for b in bugs)


@dataclass(frozen=True)
class _Seen(Message):
    """What a test's worker saw of its environment."""

    value: object


def _seen(child, workers: int, device: str) -> tuple[dict, list]:
    """What each of ``workers`` workers running ``child`` reported, by index; and the workers."""
    processes = transport.ProcessTransport(device)
    started = processes.start(child, [None] * workers, "test")
    try:
        return {w.index: m.value for w, m in processes.events() if isinstance(m, _Seen)}, started
    finally:
        processes.end()


def _report_gpu(channel, index: int, payload) -> None:
    channel.send(_Seen(os.environ.get("CUDA_VISIBLE_DEVICES")))


def test_worker_i_gets_visible_gpu_i_mod_n_before_it_starts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")  # what this process may use: workers share it out
    seen, workers = _seen(_report_gpu, 3, "cuda")
    assert seen == {0: "3", 1: "5", 2: "3"} and [w.gpu for w in workers] == ["3", "5", "3"]
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert transport.visible_gpus("cpu") == []


def test_examples_and_seeds_are_split_deterministically():
    from flashcheck.campaign.scheduler.seeds import job_seed, split_examples

    assert split_examples(7, 3) == [3, 2, 2] and split_examples(2, 3) == [1, 1, 0]
    assert job_seed(5, 0, 1) == 5 and job_seed(None, 1, 2) is None
    assert job_seed(5, 1, 2) == job_seed(5, 1, 4) != job_seed(5, 0, 2)


def _report_threads(channel, index: int, payload) -> None:
    import torch

    channel.send(_Seen((os.environ.get("OMP_NUM_THREADS"), os.environ.get("OPENBLAS_NUM_THREADS"),
                        torch.get_num_threads())))


def test_workers_share_the_cores_instead_of_each_taking_all(monkeypatch):
    for name in transport.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(transport, "usable_cores", lambda: 8)
    seen, _ = _seen(_report_threads, 4, "cpu")
    assert list(seen.values()) == [("2", "2", 2)] * 4  # 8 cores over 4 workers, torch's own pool included
    assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's choice wins
    seen, _ = _seen(_report_threads, 2, "cpu")
    assert {t[0] for t in seen.values()} == {"3"}


def test_usable_cores_follow_the_affinity_not_the_machine():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})  # as `taskset -c N` would
        assert transport.usable_cores() == 1
        assert transport.threads_per_worker(2) == "1"
    finally:
        os.sched_setaffinity(0, before)
    assert transport.usable_cores() == len(before)
