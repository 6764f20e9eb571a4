"""The defect models name the planted bugs of flashcheck's Triton kernel that commit their mistake, each on the
input that exposes it, under the Triton interpreter: the model is the best fit, and the legal twin is not.

The planted bugs are independent code (text edits of forward.py and backward.py); the models are the twin's
named points (flashcheck.numerics.twin.Defect, flashcheck.defects.gradients.GradientDefect).
"""

from __future__ import annotations

import pytest
import torch

from flashcheck import AttentionCase
from flashcheck.defects import MODELS, explain
from flashcheck.features.variant import Variant
from flashcheck.judge.backward import backward_case
from flashcheck.judge.check import check
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant
from tests.interpreter import test_backward_mutants as backward_probes
from tests.interpreter import test_mutants as forward_probes

pytestmark = pytest.mark.interpreter


def _sentinel_case() -> AttentionCase:
    """A bias of -inf entries that hides every key of row 0 (of both batch entries): a finite sentinel gives that
    row the mean of V, where the kernel promises 0."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, generator=g) for n in (33, 45, 45))
    bias = torch.randn(2, 1, 33, 45, generator=g)
    bias[torch.rand(bias.shape, generator=g) < 0.3] = float("-inf")
    bias[:, :, 0] = float("-inf")
    return AttentionCase.create(q, k, v, scale=0.25, variant=Variant(attn_bias=bias))


def _probe(name: str):
    """(case, block size) of a planted bug's exposing input."""
    if name in forward_probes.PROBES:
        probe = forward_probes.PROBES[name]()
        return probe.case, probe.block_n
    if name in backward_probes.PROBES:
        probe = backward_probes.PROBES[name]
        return backward_case(backward_probes._case(probe), upstream=probe.upstream, seed=1), backward_probes.BLOCK
    assert name == "bias_finite_sentinel", name
    return _sentinel_case(), 16


PLANTED = [(model.name, planted.split("~")[1]) for model in MODELS for planted in model.planted
           if planted.startswith("flashcheck:triton~")]


@pytest.mark.parametrize(("model", "bug"), PLANTED, ids=[bug for _, bug in PLANTED])
def test_each_model_is_the_best_fit_to_its_planted_bug(model, bug):
    case, block = _probe(bug)
    kernel = load_mutant(bug, block_m=block, block_n=block, input_precision="ieee")
    explained = explain(kernel, case, device="cpu")
    assert explained.best is not None and explained.best.model == model, explained.line()
    assert explained.best.fit <= 1.0 and explained.best.model_ratio > 1.0, explained.line()
    assert explained.line().startswith(f"matches {explained.named}: the kernel "), explained.line()


def test_no_model_explains_a_correct_kernel_on_its_nearest_cases():
    """The probes of the rounding bugs, on the correct kernel: within the budget, and no model named."""
    kernel = make_kernel(block_m=16, block_n=16)
    for bug in ("scores_rounded_to_input_dtype", "p_rounded_to_bf16", "acc_rounded_to_fp16"):
        case, _ = _probe(bug)
        verdict = check(kernel, case, device="cpu", properties=(), envelope=False)
        assert verdict.status == "PASS", str(verdict)
        explained = explain(kernel, case, device="cpu", verdict=verdict)
        assert explained.named is None and explained.tried > 20, explained.line()
