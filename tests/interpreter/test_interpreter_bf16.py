"""The Triton interpreter's bf16 tl.dot multiplies raw bit patterns; flashcheck must call it a BUG
and point at the matmul, not pass it and not blame the softmax."""

from __future__ import annotations

import pytest

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_values
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel

pytestmark = pytest.mark.interpreter


def test_interpreter_bf16_matmul_is_a_bug_pointing_at_the_matmul():
    s = Shapes(1, 2, 1, 20, 40, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="bf16", seed=0)
    case = AttentionCase.create(q, k, v, scale=0.25)
    verdict = check(resolve_kernel("flashcheck:triton", device="cpu", block_m=16, block_n=16), case,
                    device="cpu", properties=())
    assert verdict.status == "BUG"
    assert {f.kind for f in verdict.findings} & {"over_budget", "nonfinite"}
    diagnosis = " ".join(f.diagnosis for f in verdict.findings)
    assert "outside the softmax (the P @ V matmul" in diagnosis
    assert "raw bit patterns" in diagnosis


def test_fp16_on_the_interpreter_gets_no_matmul_note():
    s = Shapes(1, 2, 1, 20, 40, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp16", seed=0)
    verdict = check(resolve_kernel("flashcheck:triton", device="cpu", block_m=16, block_n=16),
                    AttentionCase.create(q, k, v, scale=0.25), device="cpu")
    assert verdict.status == "PASS", str(verdict)
