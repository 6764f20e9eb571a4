"""Kernels run in a worker process: what the kernel does to its process is a finding, never the end.

The worker is tested directly on hand-built cases (cheap: one restart each), then through
``flashcheck fuzz`` on the same planted kernels (the whole path: finding, saved case, summary).
"""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck import AttentionCase, check
from flashcheck.campaign.worker import KernelWorker, WorkerProcess, WorkerStartError, default_case_timeout
from flashcheck.cli import main
from flashcheck.judge.verdict import BUG, PASS, Verdict
from flashcheck.kernels.registry import resolve_kernel

from ._run import K, fuzz


def make_case(n_q: int, *, dtype=torch.float32, seed: int = 0) -> AttentionCase:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g).to(dtype) for n in (n_q, 24, 24))
    return AttentionCase.create(q, k, v, scale=0.25, provenance={"strategy": "random/none"})


SMALL, BIG = make_case(8), make_case(32)  # the planted kernels misbehave on more than 16 query rows


def kinds(verdict: Verdict) -> list:
    return [f.kind for f in verdict.findings]


# ---- the worker on hand-built cases -------------------------------------------------------------------


def test_a_dead_worker_is_a_crash_finding_and_the_next_case_gets_a_fresh_one():
    # (an exit code instead of a signal: test_fuzz_reports_a_dying_kernel_and_goes_on)
    with KernelWorker(f"{K}:segfaults", device="cpu") as worker:
        assert worker.check(SMALL).status == PASS
        verdict = worker.check(BIG)
        assert verdict.status == BUG and kinds(verdict) == ["crash"]
        assert "worker process" in verdict.findings[0].diagnosis
        assert "killed by signal SIGSEGV" in verdict.findings[0].diagnosis
        assert verdict.case == BIG.describe() and verdict.regime == "random/none"
        assert worker.check(SMALL).status == PASS and worker.restarts == 1


def test_a_hanging_kernel_is_a_timeout_finding_and_its_worker_is_killed():
    with KernelWorker(f"{K}:hangs", device="cpu", case_timeout=30) as worker:
        assert worker.check(SMALL).status == PASS
        worker.case_timeout = 1.0  # only now: the first case pays the worker's warm-up
        verdict = worker.check(BIG)
        assert verdict.status == BUG and kinds(verdict) == ["timeout"]
        assert "1 s" in verdict.findings[0].diagnosis and 1.0 <= verdict.elapsed["kernel"] < 10
        assert not worker.alive
        worker.case_timeout = 30
        assert worker.check(SMALL).status == PASS and worker.restarts == 1


def test_a_poisoned_cuda_context_ends_the_worker_after_its_finding():
    # The planted kernel fails on every call after the first error, like a real poisoned context: the
    # small case after it passes only because the worker exited by itself and a fresh one ran it.
    with KernelWorker(f"{K}:poisons_cuda", device="cpu") as worker:
        verdict = worker.check(BIG)
        assert kinds(verdict) == ["crash"] and "illegal memory access" in verdict.findings[0].diagnosis
        assert not worker.alive
        assert worker.check(SMALL).status == PASS and worker.restarts == 1


def test_a_cuda_error_that_surfaces_in_flashcheck_is_the_kernels_crash():
    with KernelWorker(f"{K}:poisons_cuda_later", device="cpu") as worker:
        verdict = worker.check(BIG)
        assert kinds(verdict) == ["crash"] and "CUDA context broke" in verdict.findings[0].diagnosis
        assert "illegal memory access" in verdict.findings[0].diagnosis
        assert not worker.alive
        assert worker.check(SMALL).status == PASS and worker.restarts == 1


def test_out_of_memory_skips_the_case_in_process_and_in_the_worker():
    kernel = resolve_kernel(f"{K}:out_of_memory", device="cpu")
    verdict = check(kernel, BIG, device="cpu")
    assert verdict.skipped.startswith("oom:") and "OutOfMemoryError" in verdict.skipped
    assert verdict.findings == [] and "skipped" in str(verdict)
    assert check(kernel, SMALL, device="cpu").skipped is None
    # a property's rerun that runs out of memory skips the case too, instead of calling it a crash
    rerun = check(resolve_kernel(f"{K}:oom_on_rerun", device="cpu"), SMALL, device="cpu", properties=("layout",))
    assert rerun.findings == [] and "rerun" in rerun.skipped
    with KernelWorker(f"{K}:out_of_memory", device="cpu") as worker:
        assert worker.check(BIG).skipped.startswith("oom:")
        assert worker.check(SMALL).status == PASS and worker.restarts == 0  # the process is fine


def test_cuda_s_own_out_of_memory_error_skips_the_case_too():
    verdict = check(resolve_kernel(f"{K}:cuda_out_of_memory", device="cpu"), BIG, device="cpu")
    assert verdict.findings == [] and verdict.skipped.startswith("oom:") and "AcceleratorError" in verdict.skipped
    crashed = check(resolve_kernel(f"{K}:poisons_cuda", device="cpu"), BIG, device="cpu")
    assert kinds(crashed) == ["crash"]  # CUDA's other errors stay the kernel's crash


def test_wrong_output_is_a_finding_through_the_worker():
    # (a wrong shape, found and shrunk by a campaign: test_fuzz_finds_a_wrong_shape_through_the_worker)
    with KernelWorker(f"{K}:wrong_dtype", device="cpu") as worker:
        verdict = worker.check(make_case(32, dtype=torch.float16))
        assert kinds(verdict) == ["wrong_output"] and "dtype torch.float32" in verdict.findings[0].diagnosis
        assert worker.check(SMALL).status == PASS


def test_the_verdict_survives_the_trip_from_the_worker():
    kernel = resolve_kernel(f"{K}:two_bugs", device="cpu")
    with KernelWorker(f"{K}:two_bugs", device="cpu") as worker:
        for case, status in ((SMALL, PASS), (make_case(12), BUG)):
            here = check(kernel, case, device="cpu", properties=())
            there = worker.check(case)
            assert here.status == status and there.as_dict() == here.as_dict() | {"elapsed": there.elapsed}
            assert Verdict.from_dict(here.as_dict()).as_dict() == here.as_dict()
    assert math.isnan(Verdict.from_dict({"status": PASS, "max_ratio": "nan"}).max_ratio)


def test_a_kernel_the_worker_cannot_load_is_refused_by_name():
    with pytest.raises(WorkerStartError, match="nonesuch.*--no-isolation"):
        KernelWorker(f"{K}:nonesuch", device="cpu").start()


def test_default_case_timeouts():
    assert default_case_timeout("cuda") == 300 and default_case_timeout("cpu") == 600
    assert default_case_timeout(torch.device("cuda", 1)) == 300 and default_case_timeout(torch.device("cpu")) == 600
    assert default_case_timeout("cuda:1") == 300


# ---- the same through `flashcheck fuzz` ------------------------------------------------------------------


def test_fuzz_reports_a_dying_kernel_and_goes_on(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "exits", "--keep-going", "--max-examples", "400", "--time-budget", "15")
    assert code == 1 and summary["verdict"] == "BUG" and summary["stopped"] == "time_budget"
    crash = [f for f in summary["findings"] if f["kinds"] == ["crash"]]
    assert crash and all("died (exit code 3)" in f["diagnosis"][0] for f in crash)
    assert AttentionCase.load(crash[0]["path"]).shapes.n_q > 16
    assert summary["worker_restarts"] >= 1 and summary["bug_signatures"]["crash:process_died"] >= 1
    # Cases after the first death still ran, each in a fresh worker (on a loaded machine, with restarts of
    # seconds each, the whole budget can go to shrinking the crash, so no later case need pass).
    assert summary["cases"] >= 2 and summary["worker_restarts"] >= 1
    assert "restarts" in capsys.readouterr().out


def test_fuzz_times_out_a_hanging_kernel(tmp_path):
    code, summary = fuzz(tmp_path, "hangs", "--case-timeout", "2", "--time-budget", "4")
    assert code == 1 and summary["timeouts"] >= 1 and summary["case_timeout_s"] == 2
    timeout = [f for f in summary["findings"] if f["kinds"] == ["timeout"]]
    assert timeout and AttentionCase.load(timeout[0]["path"]).shapes.n_q > 16


def test_fuzz_counts_out_of_memory_cases_as_skipped(tmp_path, capsys):
    code, summary = fuzz(tmp_path, "out_of_memory", "--max-examples", "10")
    assert code == 0 and summary["verdict"] == "PASS" and summary["findings"] == []
    assert summary["skipped"]["oom"] >= 1 and summary["cases"] == 10
    assert sum(summary["counts"]["by_status"].values()) == 10 - summary["skipped"]["oom"]
    assert f"skipped (not judged): {summary['skipped']['oom']} cases (" in capsys.readouterr().out


def test_fuzz_finds_a_wrong_shape_through_the_worker(tmp_path):
    code, summary = fuzz(tmp_path, "wrong_shape", "--max-examples", "40")
    assert code == 1 and summary["isolation"] == "worker"
    assert summary["findings"][-1]["kinds"] == ["wrong_output"] and summary["findings"][-1]["shrunk"]


def test_fuzz_without_isolation_runs_in_process(tmp_path):
    code, summary = fuzz(tmp_path, "correct", "--no-isolation", "--max-examples", "5")
    assert code == 0 and summary["isolation"] == "in-process" and summary["worker_restarts"] == 0


def test_a_kernel_object_runs_in_process(tmp_path):
    # run_campaign cannot send an object to another process: it runs it here, as before the worker
    from flashcheck.campaign.config import CampaignConfig, Target
    from flashcheck.campaign.run import run_campaign
    from flashcheck.errors import InvalidArgument
    from flashcheck.inputs.presets import load_preset

    from . import _kernels

    config = CampaignConfig(Target(_kernels.correct, "cpu", load_preset("smoke"))).replace(corpus=tmp_path)
    result = run_campaign(config.replace(max_examples=3, seed=0))
    assert result.isolation == "in-process" and result.verdict == PASS and result.cases == 3
    with pytest.raises(InvalidArgument, match="case_timeout"):
        run_campaign(config.replace(case_timeout=5))


def test_a_case_still_running_past_the_time_budget_is_given_up_and_the_campaign_ends(tmp_path, monkeypatch):
    """A torch:flex campaign on an H200 ran minutes past its 70 s budget, its first case still compiling: a
    case in flight past the budget by its grace is now given up, unjudged, and the campaign ends."""
    import time

    import flashcheck.campaign.run as campaign_run
    from flashcheck.campaign.config import CampaignConfig, Target
    from flashcheck.inputs.presets import load_preset

    monkeypatch.setattr(campaign_run, "GRACE_MIN_S", 1.0)
    started = time.monotonic()
    result = campaign_run.run_campaign(CampaignConfig(Target(f"{K}:stalls", "cpu", load_preset("smoke"))).replace(
        time_budget=2.0, case_timeout=120, corpus=tmp_path))
    assert time.monotonic() - started < 40  # the kernel alone would take 60 s
    assert result.stopped == "time_budget" and result.cases == 0 and result.verdict != PASS
    assert any("past the time budget was given up" in note for note in result.notes)


def test_a_case_timeout_without_a_worker_is_a_usage_error(tmp_path, capsys):
    assert main(["fuzz", f"{K}:correct", "--device", "cpu", "--no-isolation", "--case-timeout", "5",
                 "--corpus", str(tmp_path)]) == 2
    assert "--case-timeout" in capsys.readouterr().err


# ---- a worker process started before its kernel is named (flashcheck fuzz starts it first thing) -----------


def test_a_worker_process_started_early_becomes_the_kernels_worker():
    with WorkerProcess() as early:
        early.assign(f"{K}:correct", device="cpu")  # it loads the kernel now; nobody waits
        with KernelWorker(f"{K}:correct", device="cpu", process=early) as worker:
            assert worker.check(SMALL).status == PASS
            assert worker.starts == 1 and worker.restarts == 0 and not early.available
        assert not worker.alive


def test_an_early_worker_process_assigned_another_kernel_is_not_used():
    early = WorkerProcess()
    early.assign(f"{K}:segfaults", device="cpu")
    with KernelWorker(f"{K}:correct", device="cpu", process=early) as worker:
        assert worker.check(BIG).status == PASS and worker.starts == 1  # a fresh process, the right kernel
    assert not early.available


def test_a_kernel_an_early_worker_process_cannot_load_is_refused_as_before():
    early = WorkerProcess()
    with pytest.raises(WorkerStartError, match="nonesuch.*--no-isolation"):
        KernelWorker(f"{K}:nonesuch", device="cpu", process=early).start()
    assert not early.available


def test_an_early_worker_process_nobody_takes_is_ended():
    early = WorkerProcess()
    process = early._process
    early.close()
    assert not early.available and not process.is_alive()
    early.close()  # again: nothing
    with KernelWorker(f"{K}:correct", device="cpu", process=early) as worker:  # a closed one is not used
        assert worker.check(SMALL).status == PASS and worker.starts == 1
