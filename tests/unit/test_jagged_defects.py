"""PyTorch's jagged nested tensors through SDPA (``torch:jagged``, torch 2.13 on the CPU): a batch with a sequence
that has no keys crashes when no sequence has more than one query, and a batch with no tokens at all crashes;
both are kept out of campaigns by its spec (``empty_sequences``) and kept visible here, beside controls."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.serving import ServingCase


def _case(q_lens, k_lens) -> ServingCase:
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
    from flashcheck.inputs.strategies import recipe_pools
    from flashcheck.kernels.registry import resolve_kernel

    pools = recipe_pools(spec=resolve_kernel("torch:jagged", device="cpu").spec)
    assert not {"empty_sequences", "fewer_tokens_than_batch"} & set(pools["packing"])
