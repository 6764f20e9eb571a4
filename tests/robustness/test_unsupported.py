"""A kernel that raises flashcheck.Unsupported for an input skips that case; any other exception is a crash."""

from __future__ import annotations

import pickle

import torch

import flashcheck
from flashcheck import AttentionCase, check, check_backward
from flashcheck.campaign.worker import KernelWorker
from flashcheck.judge.verdict import BUG, PASS, Verdict
from flashcheck.kernels.registry import resolve_kernel

from ._run import K


def make_case(n_k: int, *, seed: int = 0) -> AttentionCase:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, 16, generator=g) for n in (8, n_k, n_k))
    return AttentionCase.create(q, k, v, scale=0.25, provenance={"strategy": "random/none"})


EVEN, ODD = make_case(24), make_case(23)


def test_unsupported_carries_its_reason_positional_or_keyword():
    for error in (flashcheck.Unsupported("no odd key counts"), flashcheck.Unsupported(reason="no odd key counts")):
        assert isinstance(error, flashcheck.FlashcheckError)
        assert error.reason == str(error) == "no odd key counts"
        assert pickle.loads(pickle.dumps(error)).reason == "no odd key counts"


def test_unsupported_inputs_are_skipped_and_the_others_judged():
    kernel = resolve_kernel(f"{K}:odd_keys_unsupported", device="cpu")
    judged = check(kernel, EVEN, device="cpu")
    assert judged.status == PASS and judged.skipped is None and judged.max_ratio >= 0
    skipped = check(kernel, ODD, device="cpu")
    assert skipped.skipped == "unsupported: an odd number of keys (23)"
    assert skipped.status == PASS and skipped.findings == [] and "skipped, not judged" in str(skipped)
    assert skipped.kernel == kernel.name and skipped.case == ODD.describe() and skipped.regime == "random/none"


def test_unsupported_on_a_propertys_rerun_skips_the_case():
    kernel = resolve_kernel(f"{K}:strided_q_unsupported", device="cpu")
    assert check(kernel, EVEN, device="cpu", properties=()).status == PASS
    verdict = check(kernel, EVEN, device="cpu", properties=("layout",))
    assert verdict.skipped == "unsupported: q must be contiguous" and verdict.findings == []


def test_any_other_exception_is_still_a_crash():
    kernel = resolve_kernel(f"{K}:raises_value_error", device="cpu")
    assert check(kernel, EVEN, device="cpu").status == PASS
    verdict = check(kernel, ODD, device="cpu")
    assert verdict.skipped is None and verdict.status == BUG
    assert [f.kind for f in verdict.findings] == ["crash"]
    assert verdict.findings[0].diagnosis == "ValueError: cannot handle 23 keys"


def test_a_skipped_verdict_survives_its_dict():
    verdict = check(resolve_kernel(f"{K}:odd_keys_unsupported", device="cpu"), ODD, device="cpu")
    again = Verdict.from_dict(verdict.as_dict())
    assert again.skipped == verdict.skipped and again.findings == [] and again.status == PASS


def test_unsupported_crosses_the_worker_process():
    with KernelWorker(f"{K}:odd_keys_unsupported", device="cpu") as worker:
        assert worker.check(EVEN).status == PASS
        verdict = worker.check(ODD)
        assert verdict.skipped == "unsupported: an odd number of keys (23)" and verdict.findings == []
        assert worker.check(make_case(10, seed=1)).skipped is None
        assert worker.restarts == 0  # declining an input is no reason to restart the process
    with KernelWorker(f"{K}:raises_value_error", device="cpu") as worker:
        verdict = worker.check(ODD)
        assert verdict.skipped is None and [f.kind for f in verdict.findings] == ["crash"]


def test_a_forced_sdpa_backend_that_refuses_an_input_skips_the_case():
    """The CPU flash backend refuses Dv != D at call time (PyTorch explains why in a warning): the
    case is skipped with PyTorch's reason, not reported as a crash."""
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 4, 16, generator=g), torch.randn(1, 2, 6, 16, generator=g)
    v = torch.randn(1, 2, 6, 8, generator=g)
    verdict = check("torch:flash", AttentionCase.create(q, k, v, scale=0.25), device="cpu")
    assert verdict.findings == [] and verdict.skipped.startswith("unsupported: Flash attention requires")
    assert "Value.size(-1): 8" in verdict.skipped and "Triggered internally" not in verdict.skipped


def test_a_backward_out_of_device_memory_skips_the_case():
    kernel = resolve_kernel(f"{K}:backward_out_of_memory", device="cpu")
    small = AttentionCase.create(*(t[:, :, :8] for t in (EVEN.q, EVEN.k, EVEN.v)), scale=0.25)
    assert check_backward(kernel, small, device="cpu").skipped is None
    big = make_case(24, seed=2)
    big = AttentionCase.create(big.q.repeat(1, 1, 3, 1), big.k, big.v, scale=0.25)  # 24 query rows: past BIG
    verdict = check_backward(kernel, big, device="cpu")
    assert verdict.findings == [] and verdict.skipped.startswith("oom: the kernel's forward and backward: "
                                                                 "OutOfMemoryError"), str(verdict)
