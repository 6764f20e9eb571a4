"""fla-core's Triton softmax attention (fla:parallel_attn) under the Triton interpreter: it passes on windows
and sinks, and its backward's known defect stays visible (dS rounded to fp16 past 65,504). Skipped where
fla-core is not installed (pip install fla-core==0.6.0 einops). Its varlen form (cu_seqlens) passes too."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, Variant

pytestmark = pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed")

REPORT = Path(__file__).resolve().parents[2] / "reports" / "variants-2026-12-01" / "fla-cpu"


@pytest.mark.parametrize("variant", [Variant(), Variant(window=(5, 0)), Variant(sinks=torch.tensor([2.0, -math.inf])),
                                     Variant(window=(0, 3), sinks=torch.tensor([30.0, -30.0]))])
def test_windows_and_sinks_pass(variant):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen).half() for _ in range(3))
    case = AttentionCase.create(q, k, v, scale=0.2, causal="bottom_right", variant=variant)
    verdict = flashcheck.check("fla:parallel_attn", case, device="cpu", properties=())
    assert verdict.status == "PASS", str(verdict)


def test_the_backward_rounds_ds_to_fp16_past_its_range():
    case = AttentionCase.load(next(REPORT.glob("*nonfinite-shrunk*.json")))
    verdict = flashcheck.check_backward("fla:parallel_attn", case, device="cpu")
    assert verdict.status == "BUG" and any(f.kind == "nonfinite" for f in verdict.findings), str(verdict)
    kept_out = flashcheck.check_backward("fla:parallel_attn", case, device="cpu", exclusions=True)
    assert kept_out.skipped and "ds_past_range" in kept_out.skipped


@pytest.mark.parametrize("packing", ["ragged", "empty_sequences", "single_tokens"])
def test_its_varlen_form_passes_on_packed_batches_with_empty_sequences(packing):
    from flashcheck.inputs.packing import serving_case

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 40, 16, generator=gen).half() for _ in range(3))
    base = AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right", variant=Variant(window=(7, 0)))
    case = serving_case(base, form="varlen", packing=packing, pages="none", poison="huge", seed=2, same_lengths=True)
    assert case.q_lens == case.k_lens
    verdict = flashcheck.check("fla:parallel_attn-varlen", case, device="cpu")
    assert verdict.status == "PASS" and "isolation" in verdict.properties, str(verdict)
