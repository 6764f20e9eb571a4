"""flashcheck's Triton fp8 kernel with K and V block scales (the per_block_kv scheme), compiled for a CUDA GPU: its
fp8 dot for the scores and its bf16 dot for P @ V match float64 attention over the dequantized values in e4m3 and
e5m2, every causal alignment, GQA, D 256 and Dv apart; flashcheck judges it PASS, and each planted bug is far off
(or NaN) and a BUG there too. tests/interpreter/test_fp8_kv_blocks.py runs it on the CPU."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.validation import Shapes
from flashcheck.kernels.planted import FP8_KV_BLOCKS
from flashcheck.kernels.registry import resolve_kernel

from .._fp8_kv_blocks import NAME, errors, kv_blocks_case, within_tolerance
from ._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON + [
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="fp8 tensor cores need compute capability 8.9 or newer")]

CAUSAL = ("none", "top_left", "bottom_right")
SHAPES = (Shapes(2, 4, 2, 37, 70, 64, 64), Shapes(1, 6, 3, 20, 48, 256, 80), Shapes(2, 8, 2, 130, 301, 128, 128))


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_the_compiled_kernel_matches_float64_attention(dtype, shapes):
    kernel = resolve_kernel(NAME, device="cuda")
    for seed, causal in enumerate(CAUSAL):
        err, largest, lse_err, nan = errors(kernel, kv_blocks_case(shapes, dtype, seed), causal, device="cuda")
        assert not nan and within_tolerance(err, largest) and lse_err <= 1e-3, (causal, err, largest, lse_err)


@pytest.mark.parametrize("mutant", [bug.name for bug in FP8_KV_BLOCKS])
def test_each_planted_bug_is_far_off_on_the_gpu(mutant):
    err, largest, _, nan = errors(resolve_kernel(f"{NAME}~{mutant}", device="cuda"), kv_blocks_case(), "none",
                                  device="cuda")
    assert nan if mutant == "zero_scale_divides" else (not nan and err > 0.1 * largest), (err, largest)


def test_flashcheck_passes_the_compiled_kernel_and_calls_each_planted_bug_a_bug():
    for shapes in SHAPES:
        case = kv_blocks_case(shapes, seed=3).attention_case("bottom_right")
        verdict = flashcheck.check(NAME, case, device="cuda")
        assert verdict.status == "PASS", str(verdict)
    case = kv_blocks_case().attention_case("bottom_right")
    for bug in FP8_KV_BLOCKS:
        verdict = flashcheck.check(f"{NAME}~{bug.name}", case, device="cuda", properties=())
        assert verdict.status == "BUG", (bug.name, str(verdict))
