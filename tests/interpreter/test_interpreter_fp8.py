"""The Triton interpreter's fp32 -> fp8 conversion rounds wrongly, so flashcheck's Triton fp8 kernel runs on
GPUs only. Values that round up to a power of two come out at the power of two below (0.0307 as e4m3 or e5m2:
0.015625, not 0.03125; not every such value: 0.0615 rounds to 0.0625 as it should); torch's conversion, the
control, rounds to nearest. The registry's
refusal names the defect; this test fails once Triton fixes it, and the kernel can then run here."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.kernels.registry import resolve_kernel

triton = pytest.importorskip("triton")
tl = triton.language


@triton.jit
def _convert(X, Y, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(Y + i, tl.load(X + i).to(Y.dtype.element_ty))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_the_interpreter_rounds_a_value_up_to_the_power_of_two_below(dtype):
    x = torch.tensor([0.030739566, 0.75, 1.0, 0.5], dtype=torch.float32)
    y = torch.empty(4, dtype=dtype)
    _convert[(1,)](x, y, N=4)
    want = x.to(dtype).float()
    assert want[0] == 2.0**-5  # torch, the control: to nearest, carried into the exponent
    assert y.float()[0] == 2.0**-6  # the interpreter: half of it
    assert torch.equal(y.float()[1:], want[1:])  # exact values pass through


def test_the_registry_refuses_the_fp8_kernel_on_the_cpu_and_says_why():
    with pytest.raises(flashcheck.BackendUnavailable, match="rounds fp32 to fp8 wrongly"):
        resolve_kernel("flashcheck:triton-fp8", device="cpu")
