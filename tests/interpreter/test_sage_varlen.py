"""SageAttention 1.0.6's varlen call (sage:sageattn-varlen) under the Triton interpreter, judged against its own
quantizer's values, k's mean over the whole packed batch included: on whole key tiles it is within the budget,
causal or not; the isolation property stays sound where poisoning other sequences legitimately moves a sequence's
codes (that mean), and still catches a kernel that attends another sequence's keys; its defects stay visible, each
against a control that passes. Skipped where sageattention is not installed (pip install sageattention==1.0.6)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

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


def test_isolation_poisons_the_values_alone_where_poisoned_keys_move_every_code():
    case = _case([64, 64])
    kernel = resolve_kernel(NAME, device="cpu")
    first = run_form(kernel, case, "cpu")
    poisoned = run_form(kernel, case.with_sequences_poisoned(torch.tensor([False, True])), "cpu")
    # poisoned keys move k's mean over the batch, so sequence 0's codes and bits change: its convention, no leak
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
    case = _case([64, 64], spread=0.0)
    twins = dataclasses.replace(case.base, **{t: getattr(case.base, t)[:1].repeat(2, 1, 1, 1) for t in "qkv"})
    # two equal sequences: attending both is attending one twice, within the budget until the other is poisoned
    verdict = flashcheck.check(leaky, case.with_base(twins), device="cpu")
    assert _kinds(verdict) == {"poison_leak"}, str(verdict)  # it smooths a copy of k: no write


CASES = Path(__file__).parent / "sage_cases"  # shrunk by a CPU campaign (reports/sage-2026-12-07, varlen)


def _saved(stem: str) -> ServingCase:
    return AttentionCase.load(CASES / f"sage-sageattn-varlen-{stem}.json")


def test_the_keys_a_partial_tile_pads_take_weight_one_key_gives_v_over_64():
    case = _saved("input_written+over_budget-shrunk-ca8ac79c0d")  # fp16, one sequence of one key, non-causal
    verdict = flashcheck.check(NAME, case, device="cpu", properties=())
    assert "over_budget" in _kinds(verdict) and verdict.max_ratio > 100, str(verdict)
    assert torch.allclose(verdict.output[0].double()[0], case.base.v[0, :, 0].double() / 64, rtol=1e-2)
    control = flashcheck.check(NAME, case.with_base(dataclasses.replace(case.base, causal="top_left")), device="cpu",
                               properties=())
    assert _kinds(control) == {"input_written"}, str(control)  # its causal path masks the padded columns


def test_its_causal_mask_of_minus_1e6_lets_a_key_in_past_logits_of_a_million():
    case = _saved("input_written+over_budget-shrunk-838bdddacc")  # fp32, scale 8, 3 keys
    verdict = flashcheck.check(NAME, case, device="cpu", properties=())
    assert "over_budget" in _kinds(verdict), str(verdict)
    control = flashcheck.check(NAME, case.with_base(dataclasses.replace(case.base, scale=1e-3)), device="cpu",
                               properties=())
    assert _kinds(control) == {"input_written"}, str(control)


@pytest.mark.parametrize("stem", ["input_written+over_budget+poison_leak-shrunk-4267a0eff0",
                                  "input_written+over_budget+poison_leak-shrunk-1511790394"])
def test_the_padded_keys_in_a_key_poisoned_batch_are_no_leak(stem):
    # two one-key sequences; with keys poisoned, the padding defect met in the rerun was once called poison_leak
    verdict = flashcheck.check(NAME, _saved(stem), device="cpu")
    assert "isolation" in verdict.properties and "poison_leak" not in _kinds(verdict), str(verdict)
