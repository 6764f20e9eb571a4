"""A serving-form kernel (varlen, paged, split-KV) that raises flashcheck.Unsupported, or runs out of device
memory, skips the case as a dense kernel does: on its first call, at another split count and on a property's
rerun, in this process, in the worker process and over --jobs; never a crash finding."""

from __future__ import annotations

import json

import pytest
import torch

from flashcheck import check, check_backward, property_test
from flashcheck.campaign.worker import KernelWorker
from flashcheck.cli import main
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import serving_case
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.serving import ServingCase
from flashcheck.judge.verdict import PASS
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.report.signoff import SignoffConfig, plan_signoff

from . import _serving_kernels as kernels

S = "tests.robustness._serving_kernels"
FORMS = {"varlen": "varlen", "paged": "paged", "split_kv": "paged"}  # kernel -> its form


def _base(n_q: int, n_k: int, batch: int = 3) -> AttentionCase:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, 2, n_q, 16, generator=gen)
    k, v = (torch.randn(batch, 1, n_k, 16, generator=gen) for _ in range(2))
    return AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right", provenance={"strategy": "random/none"})


def _case(form: str, *, n_q: int, n_k: int, packing: str = "full"):
    return serving_case(_base(n_q, n_k), form=form, packing=packing, pages="16", poison="huge", seed=1)


# One sequence of three with fewer keys than queries, in each form.
SOME_DECLINED = {"varlen": ServingCase(_base(4, 20), "varlen", [4, 4, 2], [20, 3, 9]),
                 "paged": _case("paged", n_q=4, n_k=20, packing="empty_sequences")}


@pytest.mark.parametrize("name", ["varlen", "paged"])
def test_a_serving_kernel_that_declines_a_batch_skips_it(name):
    kernel = resolve_kernel(f"{S}:{name}", device="cpu")
    judged = check(kernel, _case(FORMS[name], n_q=4, n_k=20), device="cpu")
    assert judged.status == PASS and judged.skipped is None and judged.max_ratio >= 0, str(judged)
    for declined in (_case(FORMS[name], n_q=9, n_k=5), SOME_DECLINED[name]):
        verdict = check(kernel, declined, device="cpu")
        assert verdict.skipped == f"unsupported: {kernels.FEWER_KEYS}", str(verdict)
        assert verdict.findings == [] and verdict.status == PASS and verdict.case == declined.describe()


def test_a_split_count_the_kernel_declines_skips_the_case():
    kernel = resolve_kernel(f"{S}:split_kv", device="cpu")
    assert check(kernel, _case("paged", n_q=1, n_k=20), device="cpu").skipped is None
    verdict = check(kernel, _case("paged", n_q=1, n_k=3), device="cpu")  # 1 split runs, 4 splits are declined
    assert verdict.skipped == f"unsupported: {kernels.MANY_SPLITS}" and verdict.findings == [], str(verdict)


def test_unsupported_on_a_serving_propertys_rerun_skips_the_case():
    kernel = resolve_kernel(f"{S}:varlen_batches_only", device="cpu")
    case = _case("varlen", n_q=4, n_k=20)
    assert check(kernel, case, device="cpu", properties=()).status == PASS
    verdict = check(kernel, case, device="cpu")  # the batch property runs the last sequence alone
    assert verdict.skipped == f"unsupported: {kernels.ONE_SEQUENCE}" and verdict.findings == [], str(verdict)


def test_a_serving_kernel_out_of_memory_skips_the_case():
    kernel = resolve_kernel(f"{S}:varlen_out_of_memory", device="cpu")
    assert check(kernel, _case("varlen", n_q=2, n_k=2), device="cpu").skipped is None
    verdict = check(kernel, _case("varlen", n_q=4, n_k=20), device="cpu")
    assert verdict.findings == [] and verdict.skipped.startswith("oom: the kernel: OutOfMemoryError"), str(verdict)


def test_a_serving_kernels_unsupported_crosses_the_worker_process():
    with KernelWorker(f"{S}:varlen", device="cpu") as worker:
        verdict = worker.check(_case("varlen", n_q=9, n_k=5))
        assert verdict.skipped == f"unsupported: {kernels.FEWER_KEYS}" and verdict.findings == []
        assert worker.check(_case("varlen", n_q=4, n_k=20)).skipped is None
        assert worker.restarts == 0


def _fuzz(tmp_path, name: str, *extra):
    out = tmp_path / "run.json"
    code = main(["fuzz", f"{S}:{name}", "--device", "cpu", "--preset", "smoke", "--seed", "2", "--max-examples", "16",
                 "--corpus", str(tmp_path / "corpus"), "--json", str(out), "--no-progress", *extra])
    return code, json.loads(out.read_text())


@pytest.mark.parametrize("name, reason, how", [
    ("varlen", kernels.FEWER_KEYS, ["--no-isolation"]),
    ("varlen", kernels.FEWER_KEYS, ["--jobs", "2", "--max-examples", "8"]),  # each job's own kernel worker
    ("paged", kernels.FEWER_KEYS, []),  # the kernel worker, as by default
    ("split_kv", kernels.MANY_SPLITS, ["--no-isolation"]),
])
def test_a_campaign_counts_a_serving_kernels_refusals_as_skips(tmp_path, capsys, name, reason, how):
    code, summary = _fuzz(tmp_path, name, *how)
    skipped = summary["skipped"].get("unsupported", 0)
    assert code in (0, 3) and summary["verdict"] in ("PASS", "NO_CASES"), summary["bugs"]
    assert skipped > 0 and summary["skipped_reasons"] == {f"unsupported: {reason}": skipped}, summary["skipped"]
    assert summary["findings"] == [] and summary["bugs"] == []
    assert f"{skipped} unsupported" in capsys.readouterr().out


def test_the_backward_of_a_serving_form_is_refused_with_a_usage_error(tmp_path, capsys):
    code = main(["fuzz", f"{S}:varlen_differentiable", "--backward", "--device", "cpu", "--max-examples", "4",
                 "--corpus", str(tmp_path / "corpus"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "backward" in err and "form='varlen'" in err and "Traceback" not in err, err
    kernel = resolve_kernel(f"{S}:varlen_differentiable", device="cpu")
    with pytest.raises(InvalidArgument, match="form='varlen'"):
        check_backward(kernel, _case("varlen", n_q=4, n_k=20), device="cpu")
    with pytest.raises(InvalidArgument, match="form='varlen'"):
        property_test(kernel, backward=True)
    plan, not_checked = plan_signoff(SignoffConfig((f"{S}:varlen_differentiable",), tmp_path / "out", "cpu",
                                                   load_preset("smoke"), backward=True))
    assert [p[1] for p in plan] == ["forward"] and "form='varlen'" in not_checked[-1], not_checked
