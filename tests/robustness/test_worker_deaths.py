"""A worker that dies or hangs in flashcheck's own code (drawing a case, judging it) is flashcheck's failure:
a skip counted as such, never the kernel's crash or timeout, never a case saved; in the kernel it still is the
kernel's. The planted failures of flashcheck are in tests.robustness._dying_flashcheck, which wraps
flashcheck's steps in the worker process only."""

from __future__ import annotations

import json

import pytest

from flashcheck.campaign.worker import KernelWorker, WorkerStartError
from flashcheck.cli import main
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.verdict import BUG, PASS

D = "tests.robustness._dying_flashcheck"
SMALL, BIG = (Recipe(Shapes(1, 2, 2, n_q, 24, 16, 16), "fp32", seed=3) for n_q in (8, 32))  # BIG: past 16 rows


def assert_flashcheck_skip(verdict, kind: str, phase: str) -> None:
    assert verdict.skipped.startswith(f"{kind}: ") and phase in verdict.skipped, verdict.skipped
    assert "flashcheck's own code" in verdict.skipped
    assert verdict.findings == [] and verdict.status != BUG


def test_a_worker_killed_while_flashcheck_draws_the_case_is_a_skip_not_a_crash():
    with KernelWorker(f"{D}:dies_drawing", device="cpu") as worker:
        assert worker.check_recipe(SMALL)[0].status == PASS
        verdict, case = worker.check_recipe(BIG)
        assert_flashcheck_skip(verdict, "worker_died", "while flashcheck drew the case")
        assert "SIGKILL" in verdict.skipped and "out-of-memory" in verdict.skipped
        assert case is None and worker.starts == 1  # no fresh worker drew it again to save it
        assert worker.check_recipe(SMALL)[0].status == PASS and worker.restarts == 1


def test_a_worker_killed_while_flashcheck_judges_the_case_is_a_skip_not_a_crash():
    with KernelWorker(f"{D}:dies_judging", device="cpu") as worker:
        verdict, case = worker.check_recipe(BIG)
        assert_flashcheck_skip(verdict, "worker_died", "while flashcheck judged the case")
        assert case is None and worker.starts == 1


def test_a_worker_hanging_while_flashcheck_draws_the_case_is_a_skip_not_a_timeout():
    with KernelWorker(f"{D}:hangs_drawing", device="cpu", case_timeout=60) as worker:
        assert worker.check_recipe(SMALL)[0].status == PASS
        worker.case_timeout = 1.0  # only now: the first case pays the worker's warm-up
        verdict, case = worker.check_recipe(BIG)
        assert_flashcheck_skip(verdict, "worker_timed_out", "while flashcheck drew the case")
        assert case is None and not worker.alive and worker.starts == 1


def test_a_worker_dying_in_the_kernel_is_still_the_kernels_crash_and_its_case_is_drawn_again():
    with KernelWorker("tests.robustness._kernels:segfaults", device="cpu") as worker:
        verdict, case = worker.check_recipe(BIG)
        assert verdict.status == BUG and [f.kind for f in verdict.findings] == ["crash"] and not verdict.skipped
        assert "killed by signal SIGSEGV" in verdict.findings[0].diagnosis
        assert case is not None and case.shapes.n_q == 32 and worker.starts == 2  # drawn again, by a fresh one


def test_a_worker_dying_in_the_kernels_backward_is_the_kernels_crash():
    # autograd runs the kernel's backward after the kernel's call returned: still the kernel's phase
    with KernelWorker("tests.robustness._kernels:segfaults_in_backward", device="cpu") as worker:
        verdict, case = worker.check_recipe(BIG, backward=True)
        assert verdict.status == BUG and [f.kind for f in verdict.findings] == ["crash"] and not verdict.skipped
        assert "killed by signal SIGSEGV" in verdict.findings[0].diagnosis and case is not None


def test_a_fresh_worker_dying_while_it_draws_a_crashed_case_again_is_no_verdict():
    # The kernel dies on BIG; the fresh worker that draws it again to save it dies drawing it (flashcheck's).
    with KernelWorker(f"{D}:segfaults", device="cpu") as worker:
        assert worker.check_recipe(SMALL)[0].status == PASS
        with pytest.raises(WorkerStartError, match=r"again to save it: it died \(killed by signal SIGKILL.*\), while "
                                                   r"flashcheck drew the case"):
            worker.check_recipe(BIG)


def test_fuzz_counts_deaths_in_flashcheck_as_its_skips_and_reports_no_bug(tmp_path, capsys):
    out = tmp_path / "run.json"
    code = main(["fuzz", f"{D}:dies_drawing", "--device", "cpu", "--preset", "smoke", "--seed", "1",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(out), "--no-progress", "--max-examples", "10",
                 "--time-budget", "60"])
    summary = json.loads(out.read_text())
    assert summary["skipped"].get("worker_died", 0) >= 1, summary["skipped"]
    assert code == 0 and summary["verdict"] == "PASS" and summary["findings"] == [] and summary["bugs"] == []
    assert not summary["bug_signatures"] and summary["worker_restarts"] >= 1  # a fresh worker after each death
    assert all("while flashcheck drew the case" in r for r in summary["skipped_reasons"] if r.startswith("worker"))
    assert "worker_died" in capsys.readouterr().out
