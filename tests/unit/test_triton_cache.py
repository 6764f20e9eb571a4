"""Triton's compile cache (where, and who sees it) and the count of compilations a verdict carries."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest
import torch

from flashcheck import AttentionCase, InvalidArgument
from flashcheck.campaign.worker import KernelWorker
from flashcheck.judge.verdict import Verdict
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.triton.cache import (
    CACHE_ENV,
    compilation_stats,
    install_hooks,
    triton_cache_dir,
    use_triton_cache,
)
from tests.robustness._run import K


@pytest.fixture
def clean_env(monkeypatch):
    """No cache setting at all; whatever the test sets is undone afterwards."""
    for name in (CACHE_ENV, "TRITON_CACHE_DIR", "TRITON_HOME"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_default_is_tritons_own_cache(clean_env, tmp_path):
    assert use_triton_cache() == os.path.join(os.path.expanduser("~"), ".triton", "cache")
    assert "TRITON_CACHE_DIR" not in os.environ  # nothing exported: Triton's default stands
    clean_env.setenv("TRITON_HOME", str(tmp_path))
    assert triton_cache_dir() == str(tmp_path / ".triton" / "cache")


def test_a_users_triton_cache_dir_is_left_alone(clean_env, tmp_path):
    clean_env.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert use_triton_cache() == str(tmp_path / "mine") == os.environ["TRITON_CACHE_DIR"]


def test_flashchecks_own_cache_wins_and_is_exported(clean_env, tmp_path):
    clean_env.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    clean_env.chdir(tmp_path)
    clean_env.setenv(CACHE_ENV, "fc-cache")  # relative: made absolute, so every process agrees
    assert use_triton_cache() == str(tmp_path / "fc-cache") == os.environ["TRITON_CACHE_DIR"]


def test_a_file_is_refused_by_name(clean_env, tmp_path):
    (tmp_path / "file").write_text("")
    clean_env.setenv(CACHE_ENV, str(tmp_path / "file"))
    with pytest.raises(InvalidArgument, match=f"{CACHE_ENV}=.*names a file, not a directory") as info:
        use_triton_cache()
    assert "unset it" in info.value.fix and "TRITON_CACHE_DIR" not in os.environ


def test_worker_processes_see_the_cache_the_campaign_chose(clean_env, tmp_path):
    clean_env.setenv(CACHE_ENV, str(tmp_path / "shared"))
    resolve_kernel(f"{K}:reports_triton_cache_dir", device="cpu")  # as a campaign does before its workers
    g = torch.Generator().manual_seed(0)
    case = AttentionCase.create(*(torch.randn(1, 1, 4, 16, generator=g) for _ in range(3)), scale=0.25)
    with KernelWorker(f"{K}:reports_triton_cache_dir", device="cpu") as worker:
        assert worker.check(case).skipped == f"unsupported: {tmp_path / 'shared'}"


def test_hooks_count_compilations_and_keep_the_hooks_set_before():
    calls = []
    runtime = SimpleNamespace(jit_cache_hook=lambda **kw: calls.append(("cache", kw["key"])) or "theirs",
                              jit_post_compile_hook=lambda **kw: calls.append(("post", kw["key"])))
    install_hooks(runtime)
    count, seconds = compilation_stats()
    assert runtime.jit_cache_hook(key="variant-1", repr="r") == "theirs"  # a true answer skips the build
    time.sleep(0.05)
    runtime.jit_post_compile_hook(key="variant-1", repr="r")
    after = compilation_stats()
    assert after[0] == count + 1 and 0.05 <= after[1] - seconds < 5
    assert calls == [("cache", "variant-1"), ("post", "variant-1")]


def test_verdicts_carry_compilations_and_old_json_still_reads():
    verdict = Verdict.from_findings([], max_ratio=0.5, elapsed={"kernel": 2.0, "compile": 1.5}, compilations=3)
    again = Verdict.from_dict(verdict.as_dict())
    assert again.compilations == 3 and again.elapsed["compile"] == 1.5
    old = {k: v for k, v in verdict.as_dict().items() if k != "compilations"}
    assert Verdict.from_dict(old).compilations == 0


def test_checking_without_triton_records_no_compile_time():
    # This process may have imported triton (other tests): look from a fresh one.
    import subprocess
    import sys

    code = ("import torch, sys; from flashcheck import AttentionCase, check; q = torch.randn(1, 1, 4, 16); "
            "v = check('torch:math', AttentionCase.create(q, q, q, scale=0.25), device='cpu'); "
            "assert 'triton' not in sys.modules; print(v.compilations, 'compile' in v.elapsed)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["0", "False"]


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_a_verdict_counts_the_compilations_made_while_it_ran(monkeypatch, backward):
    import flashcheck.judge.backward as judge_backward
    import flashcheck.judge.check as judge_check

    counts = iter([(4, 10.0), (6, 11.5)])  # Triton's totals when the case began and when it ended
    for module in (judge_check, judge_backward):
        monkeypatch.setattr(module, "compilations_so_far", lambda: next(counts))
    q = torch.randn(1, 1, 4, 16)
    case = AttentionCase.create(q, q, q, scale=0.25)
    judge = judge_backward.check_backward if backward else judge_check.check
    verdict = judge("torch:math", case, device="cpu")
    assert verdict.status == "PASS" and verdict.compilations == 2 and verdict.elapsed["compile"] == 1.5
