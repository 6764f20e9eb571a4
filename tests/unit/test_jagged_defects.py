"""PyTorch's jagged nested tensors through SDPA (``torch:jagged``, torch 2.13 on the CPU): a batch with a sequence
that has no keys crashes when no sequence has more than one query, and a batch with no tokens at all crashes;
fp16 and bf16 run PyTorch's math composite in their own dtype (q and k each times sqrt(scale), no upcast), so
they are over the budget. Its spec keeps each class out of campaigns (``empty_sequences``, fp32 alone on the
CPU); they stay visible here, beside controls. The shrunk cases are the H200 campaign's
(reports/serving-2026-12-02); tests/gpu/test_serving_gpu.py keeps the H200's own defects visible."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.serving import ServingCase
from flashcheck.kernels.registry import resolve_kernel


def _case(q_lens, k_lens) -> ServingCase:  # fp32: inside the spec but for the lengths
    gen = torch.Generator().manual_seed(0)
    B = len(q_lens)
    q, k, v = (torch.randn(B, 2, max(max(n), 1), 16, generator=gen) for n in (q_lens, k_lens, k_lens))
    return ServingCase(AttentionCase.create(q, k, v, scale=0.25), "varlen", q_lens, k_lens)


def _verdict(q_lens, k_lens):
    return flashcheck.check("torch:jagged", _case(q_lens, k_lens), device="cpu", properties=())


@pytest.mark.parametrize("k_lens", [[1, 0], [0, 1]])
def test_a_sequence_without_keys_crashes_where_every_sequence_has_one_query(k_lens):
    verdict = _verdict([1, 1], k_lens)
    assert [f.kind for f in verdict.findings] == ["crash"], str(verdict)
    assert "setStorage" in verdict.findings[0].diagnosis


def test_a_batch_without_tokens_crashes():
    verdict = _verdict([0, 0], [0, 0])
    assert [f.kind for f in verdict.findings] == ["crash"], str(verdict)
    assert "non-zero numel" in verdict.findings[0].diagnosis


@pytest.mark.parametrize("q_lens,k_lens", [([1, 1], [1, 1]), ([2, 3], [4, 0]), ([0, 1], [1, 1])])
def test_controls_with_longer_rows_or_keys_everywhere_pass(q_lens, k_lens):
    verdict = _verdict(q_lens, k_lens)
    assert verdict.ok, str(verdict)


def test_its_spec_keeps_empty_sequences_out_of_campaigns():
    from flashcheck.inputs.recipe_draws import recipe_pools
    from flashcheck.kernels.registry import resolve_kernel

    pools = recipe_pools(spec=resolve_kernel("torch:jagged", device="cpu").spec)
    assert not {"empty_sequences", "fewer_tokens_than_batch"} & set(pools["packing"])


REPORT = Path(__file__).parents[2] / "reports" / "serving-2026-12-02" / "h200" / "jagged-cases"


def _math_in_the_inputs_dtype(case: ServingCase) -> torch.Tensor:
    """PyTorch's math composite without its upcast: q and k each times sqrt(scale), every step in the dtype."""
    q, k, v = case.base.q, case.base.k, case.base.v
    root = case.scale ** 0.5
    return torch.softmax((q * root) @ (k * root).transpose(-1, -2), -1) @ v


@pytest.mark.parametrize("path", sorted(REPORT.glob("*over_budget-shrunk*.json")), ids=lambda p: p.stem[-10:])
def test_half_precision_is_computed_without_upcast_so_it_is_over_the_budget(path):
    case = load_case(path)  # one query a sequence: the packed output is (B, H, Dv)
    kernel = resolve_kernel("torch:jagged", device="cpu")
    inputs = case.physical("cpu")
    got = kernel.fn(*inputs.tensors, **inputs.kwargs, scale=case.scale).unsqueeze(2)
    assert torch.equal(got.view(torch.int16), _math_in_the_inputs_dtype(case).view(torch.int16))
    verdict = flashcheck.check(kernel, case, device="cpu", properties=())
    assert [f.kind for f in verdict.findings] == ["over_budget"], str(verdict)
    assert case.dtype not in kernel.spec.dtypes  # kept out of campaigns: fp32 alone on the CPU
