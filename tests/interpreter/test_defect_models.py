"""The defect models name the planted bugs of flashcheck's Triton kernel that commit their mistake, each on the
input that exposes it, under the Triton interpreter: the model is the best fit, and the legal twin is not.

The planted bugs are independent code (text edits of forward.py and backward.py); the models are the twin's
named points (flashcheck.numerics.twin.Defect, flashcheck.defects.gradients.GradientDefect).
"""

from __future__ import annotations

import pytest

from flashcheck.defects import explain
from flashcheck.judge.check import check
from flashcheck.kernels.triton.forward import make_kernel
from tests._defect_cases import explain_planted, planted, planted_probe

# The overflows past 65,504 that several cases are made of, as numpy reports them inside the interpreter.
pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]


PLANTED = planted()


def test_every_model_has_a_planted_bug():
    from flashcheck.defects import MODELS

    assert all(m.planted for m in MODELS), [m.name for m in MODELS if not m.planted]


@pytest.mark.parametrize(("model", "bug"), PLANTED, ids=[bug for _, bug in PLANTED])
def test_each_model_is_the_best_fit_to_its_planted_bug(model, bug):
    explained = explain_planted(bug, "cpu")
    assert explained.best is not None and explained.best.model == model, explained.line()
    assert explained.best.fit <= 1.0 and explained.best.model_ratio > 1.0, explained.line()
    assert explained.line().startswith(f"matches {explained.named}: the kernel "), explained.line()


def test_no_model_explains_a_correct_kernel_on_its_nearest_cases():
    """The probes of the rounding bugs, on the correct kernel: within the budget, and no model named."""
    kernel = make_kernel(block_m=16, block_n=16)
    for bug in ("scores_rounded_to_input_dtype", "p_rounded_to_bf16", "acc_rounded_to_fp16"):
        case, _, _ = planted_probe(bug)
        verdict = check(kernel, case, device="cpu", properties=(), envelope=False)
        assert verdict.status == "PASS", str(verdict)
        explained = explain(kernel, case, device="cpu", verdict=verdict)
        assert explained.named is None and explained.tried > 20, explained.line()
