"""flashcheck's Triton varlen kernel under the Triton interpreter: it passes on packed batches with empty
sequences, bottom-right causal per sequence, GQA and NaN in every element no sequence owns (its loads stop at
each sequence's end), and its planted bug (one key past each end) is a BUG."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import serving_case

pytestmark = pytest.mark.interpreter


def _case(packing: str):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 20, 24, generator=gen).half()
    k = torch.randn(3, 2, 40, 24, generator=gen).half()
    v = torch.randn(3, 2, 40, 40, generator=gen).half()
    base = AttentionCase.create(q, k, v, scale=24 ** -0.5, causal="bottom_right")
    return serving_case(base, form="varlen", packing=packing, pages="none", poison="nan", seed=3)


def test_the_varlen_kernel_passes_with_nan_everywhere_no_sequence_owns():
    verdict = flashcheck.check("flashcheck:triton-varlen", _case("empty_sequences"), device="cpu")
    assert verdict.ok and "isolation" in verdict.properties, str(verdict)


def test_reading_one_key_past_each_end_is_a_bug():
    verdict = flashcheck.check("flashcheck:triton-varlen~reads_past_end", _case("ragged"), device="cpu",
                               properties=())
    assert verdict.status == "BUG", str(verdict)
