"""``torch:flex-varlen`` (FlexAttention with a document mask over the packed batch, eager on the CPU): correct on
ragged batches with empty sequences and every causal alignment; a batch without tokens crashes in flex itself,
kept out of campaigns by its spec (``empty_batch``) and visible here."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import serving_case
from flashcheck.inputs.serving import ServingCase

KERNEL = "torch:flex-varlen[compile=False]"


def _base(batch=4, causal="bottom_right", n_q=9, n_k=30) -> AttentionCase:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(batch, 4, n_q, 16, generator=gen).half()
    k, v = (torch.randn(batch, 2, n_k, 16, generator=gen).half() for _ in range(2))
    return AttentionCase.create(q, k, v, scale=0.25, causal=causal)


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("packing", ["ragged", "empty_sequences", "fewer_tokens_than_batch"])
def test_the_document_mask_gives_each_sequence_its_own_attention(causal, packing):
    case = serving_case(_base(causal=causal), form="varlen", packing=packing, pages="none", poison="huge", seed=4)
    verdict = flashcheck.check(KERNEL, case, device="cpu")
    assert verdict.ok, str(verdict)


def test_a_batch_without_tokens_crashes_in_flex():
    case = ServingCase(_base(batch=1), "varlen", [0], [0])
    verdict = flashcheck.check(KERNEL, case, device="cpu", properties=())
    assert [f.kind for f in verdict.findings] == ["crash"], str(verdict)
    assert "non-zero size" in verdict.findings[0].diagnosis
