"""FlexAttention compiled on an H200 (torch 2.11): head dims that are not powers of two are padded to the next one,
and at 172 x 204 (fp16) Inductor finds no Triton config of the flex template that fits Hopper's shared memory
(262,144 bytes needed, 232,448 available) and raises instead of computing (found by the H200 campaign of
2026-12-02, reports/variants-2026-12-02-run3). The same inputs cut to 128-wide heads are the control. Skipped on a
GPU other than compute capability 9.0."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.inputs.case import load_case
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON + [
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the shared memory limit measured is a Hopper GPU's (227 KiB)"),
]

SHRUNK = Path(__file__).parents[2] / "reports" / "variants-2026-12-02-run3" / "h200" / "flex-cases" / \
    "torch-flex-crash-shrunk-990ef1b330.json"


def test_head_dims_172_by_204_in_fp16_raise_out_of_shared_memory():
    verdict = flashcheck.check("torch:flex", load_case(SHRUNK), device="cuda", properties=())
    assert verdict.status == "BUG" and [f.kind for f in verdict.findings] == ["crash"], str(verdict)
    assert "out of resource" in verdict.findings[0].diagnosis + str(verdict.findings[0].details), str(verdict)


def test_the_same_inputs_with_128_wide_heads_pass():
    case = load_case(SHRUNK)
    control = AttentionCase.create(case.q[..., :128], case.k[..., :128], case.v[..., :128], scale=case.scale,
                                   causal=case.causal, variant=case.variant)
    assert flashcheck.check("torch:flex", control, device="cuda", properties=()).status == "PASS"
