"""fla-core 0.6.0's ``attn_decoding_one_step`` sums each score in the input's half precision
(tests/_fla_decoding.py has the model and says why), which puts fp16 and bf16 over the flash contract's budget:
the H200 campaign's shrunk cases (reports/serving-2026-12-03) are over it in the model too, and the same order
with fp32 scores (the control) is inside it. The spec of ``fla:attn_decoding`` keeps half precision out of
campaigns; tests/gpu/test_fla_gpu.py keeps the kernel's own findings visible on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import load_case
from tests._fla_decoding import model_kernel

CASES = sorted((Path(__file__).parents[2] / "reports" / "serving-2026-12-03" / "h200" / "fla-decoding-cases")
               .glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_half_precision_scores_put_the_shrunk_cases_over_the_budget(path):
    case = load_case(path)
    assert case.dtype in ("fp16", "bf16")
    verdict = flashcheck.check(model_kernel(), case, device="cpu", properties=())
    assert {f.kind for f in verdict.findings} == {"over_budget"}, str(verdict)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_the_same_order_with_fp32_scores_is_inside_it(path):
    verdict = flashcheck.check(model_kernel(torch.float32), load_case(path), device="cpu", properties=())
    assert verdict.ok, str(verdict)


def test_the_spec_keeps_half_precision_out_of_campaigns():
    from flashcheck.kernels.fla import decoding_spec

    assert decoding_spec("cuda").dtypes == ("fp32",)
