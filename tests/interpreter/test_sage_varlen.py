"""SageAttention 1.0.6's varlen call (sage:sageattn-varlen) under the Triton interpreter, judged against its own
quantizer's values, k's mean over the whole packed batch included: on whole key tiles it is within the budget,
causal or not; the isolation property stays sound where poisoning other sequences legitimately moves a sequence's
codes (that mean), and still catches a kernel that attends another sequence's keys; its defects stay visible, each
against a control that passes. Skipped where sageattention is not installed (pip install sageattention==1.0.6)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.contract.spec import Kernel
from flashcheck.inputs.serving import ServingCase
from flashcheck.judge.serving import run_form
from flashcheck.kernels.registry import resolve_kernel

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sageattention") is None,
                                reason="sageattention is not installed")
NAME = "sage:sageattn-varlen"


def _case(lens, n=None, d=64, dtype=torch.float16, causal="none", heads=(2, 1), seed=0, spread=3.0):
    """Sequences of ``lens`` tokens (queries and keys alike), each sequence's keys with their own mean."""
    n, gen = n or max(lens), torch.Generator().manual_seed(seed)
    means = spread * torch.arange(len(lens), dtype=torch.float32).reshape(-1, 1, 1, 1)
    q = torch.randn(len(lens), heads[0], n, d, generator=gen).to(dtype)
    k = (torch.randn(len(lens), heads[1], n, d, generator=gen) + means).to(dtype)
    v = torch.randn(len(lens), heads[1], n, d, generator=gen).to(dtype)
    base = AttentionCase.create(q, k, v, scale=d ** -0.5, causal=causal)
    return ServingCase(base, "varlen", q_lens=lens, k_lens=lens)


def _kinds(verdict) -> set:
    return {f.kind for f in verdict.findings}


@pytest.mark.parametrize(("lens", "d", "dtype", "causal"), [
    ([64, 128, 64], 64, torch.float32, "none"), ([100, 37, 128], 128, torch.float16, "top_left")])
def test_within_the_budget_of_its_quantizer_where_no_key_is_padded(lens, d, dtype, causal):
    verdict = flashcheck.check(NAME, _case(lens, d=d, dtype=dtype, causal=causal), device="cpu", properties=())
    assert _kinds(verdict) == {"input_written"} and verdict.max_ratio < 1, str(verdict)


def test_isolation_judges_a_poisoned_batch_against_its_own_quantized_problem():
    case = _case([64, 64])
    kernel = resolve_kernel(NAME, device="cpu")
    first = run_form(kernel, case, "cpu")
    poisoned = run_form(kernel, case.with_sequences_poisoned(torch.tensor([False, True])), "cpu")
    # the poison moves k's mean over the batch, so sequence 0's codes and bits change: not a leak
    assert not torch.equal(first.out[:64], poisoned.out[:64])
    verdict = flashcheck.check(kernel, case, device="cpu")
    assert "isolation" in verdict.properties and "poison_leak" not in _kinds(verdict), str(verdict)


def test_isolation_still_catches_a_kernel_that_attends_the_other_sequences():
    real = resolve_kernel(NAME, device="cpu")

    def every_key(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
        batch, total = len(cu_seqlens_k) - 1, k.shape[0]  # each sequence given every packed key
        offsets = torch.arange(batch + 1, dtype=torch.int32) * total
        return real.fn(q, k.repeat(batch, 1, 1), v.repeat(batch, 1, 1), cu_seqlens_q=cu_seqlens_q,
                       cu_seqlens_k=offsets, max_seqlen_q=max_seqlen_q, max_seqlen_k=total, scale=scale)

    leaky = Kernel(every_key, real.spec, name="sage-every-key")
    verdict = flashcheck.check(leaky, _case([64, 64], spread=0.0), device="cpu")
    assert "poison_leak" in _kinds(verdict), str(verdict)
