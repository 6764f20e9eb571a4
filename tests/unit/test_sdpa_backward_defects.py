"""Two defects of PyTorch's CPU flash backward (torch 2.13), kept visible: when a PyTorch release fixes
them, these tests fail, and reports/results.md's table of defects needs its update. PyTorch's math backend,
on the same inputs, stays within the budget (reports/backward-cpu-2026-11-30.md)."""

from __future__ import annotations

import torch

from flashcheck import AttentionCase, check_backward


def _flash_and_math(case, do):
    return [check_backward(name, case, do=do, device="cpu") for name in ("torch:flash", "torch:math")]


def test_fp16_gradients_overflow_where_the_exact_ones_are_a_few_thousand():
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 128, generator=g).mul(0.3).half() for n in (65, 3))
    v = (torch.randn(1, 1, 3, 128, generator=g).sign() * 68).half()  # dP = dO . V near 6e5: past fp16
    do = v[:, :, :1].expand(1, 1, 65, 128).contiguous()  # along O's direction
    flash, math = _flash_and_math(AttentionCase.create(q, k, v, scale=128 ** -0.5, causal="top_left"), do)
    assert math.status == "PASS", str(math)
    assert any(f.kind == "nonfinite" for f in flash.findings), str(flash)


def test_dv_error_grows_with_the_number_of_query_rows_in_bf16():
    g = torch.Generator().manual_seed(0)
    n = 16384
    q = torch.randn(1, 1, n, 16, generator=g).bfloat16()
    k, v = (torch.randn(1, 1, 1, 16, generator=g).bfloat16() for _ in range(2))
    base = 1 + torch.arange(16) / 16.0
    do = (base.view(1, 1, 1, 16) * (1 + 2.0**-6 * torch.rand(1, 1, n, 1, generator=g))).bfloat16()
    flash, math = _flash_and_math(AttentionCase.create(q, k, v, scale=0.25), do)
    assert math.status == "PASS", str(math)
    over = [f for f in flash.findings if f.kind == "over_budget"]
    assert [f.details["gradient"] for f in over] == ["dv"] and over[0].ratio > 3, str(flash)
