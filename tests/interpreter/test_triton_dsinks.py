"""The sinks' gradient of flashcheck:triton judged by check_backward under the Triton interpreter: the
correct kernel's dSinks is within its budget, and the planted dSinks bugs (sign flipped, base 2) are
BUGs of that gradient alone."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, Variant
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant

pytestmark = pytest.mark.interpreter

BLOCK = 16


def _case():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 24, 16, generator=gen).half()
    k, v = (torch.randn(1, 1, 40, 16, generator=gen).half() for _ in range(2))
    return AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right",
                                variant=Variant(sinks=torch.tensor([0.5, 2.0])))


def test_the_correct_kernel_s_dsinks_is_judged_and_within_its_budget():
    verdict = flashcheck.check_backward(make_kernel(block_m=BLOCK, block_n=BLOCK, input_precision="ieee"), _case(),
                                        device="cpu")
    assert verdict.status == "PASS" and 0 < verdict.ratios["dsinks"] <= 1, str(verdict)


@pytest.mark.parametrize("name", ["dsinks_sign_flipped", "dsinks_in_base_2"])
def test_a_planted_dsinks_bug_is_a_bug_of_dsinks(name):
    kernel = load_mutant(name, block_m=BLOCK, block_n=BLOCK, input_precision="ieee")
    verdict = flashcheck.check_backward(kernel, _case(), device="cpu")
    assert verdict.status == "BUG", str(verdict)
    assert {(f.details or {}).get("gradient") for f in verdict.findings} == {"dsinks"}, str(verdict)
