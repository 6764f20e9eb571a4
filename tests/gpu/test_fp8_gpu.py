"""fp8 on a CUDA GPU: flashcheck's Triton fp8 kernel (fp8 tensor-core dots, FA3's descales) and the torch
reference pass drawn adversarial cases in e4m3 and e5m2, every descale regime and causal alignment, and the
planted ignored k_descale is a BUG there too."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.quantization import DESCALE_REGIMES
from flashcheck.inputs.regimes import VALUE_REGIMES
from flashcheck.inputs.recipe import Recipe

from ._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON + [
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9),
                       reason="fp8 tensor cores need compute capability 8.9 or newer")]

SHAPES = (Shapes(2, 8, 2, 77, 300, 64, 64), Shapes(1, 4, 4, 1, 1000, 128, 128), Shapes(3, 6, 3, 130, 65, 80, 48))


def _cases(dtype):
    for shapes in SHAPES:
        for values in VALUE_REGIMES:
            for seed, causal in zip(range(len(DESCALE_REGIMES)), ("none", "top_left", "bottom_right")):
                yield Recipe(shapes=shapes, dtype=dtype, values=values, causal=causal, seed=seed).build()


@pytest.mark.parametrize("kernel", ["flashcheck:triton-fp8", "torch:fp8"])
@pytest.mark.parametrize("dtype", ["fp8_e4m3", "fp8_e5m2"])
def test_the_fp8_kernels_pass_every_value_and_descale_regime(kernel, dtype):
    ratios = []
    for case in _cases(dtype):
        verdict = flashcheck.check(kernel, case, device="cuda")
        assert verdict.ok, f"{case.describe()}: {verdict}"
        ratios.append(verdict.max_ratio)
    assert max(ratios) > 0.01  # the budget is not loose everywhere: fp8's rounding of P shows


@pytest.mark.parametrize("kernel", ["flashcheck:triton-fp8~ignores_k_descale", "torch:fp8~ignores_k_descale"])
def test_an_ignored_k_descale_is_a_bug_on_the_gpu(kernel):
    kinds = [{f.kind for f in flashcheck.check(kernel, case, device="cuda").findings} for case in _cases("fp8_e4m3")]
    assert not any("crash" in k for k in kinds), kinds
    found = [k for k in kinds if k & {"over_budget", "lse", "descale_dependence"}]
    assert len(found) >= len(kinds) // 2, kinds
