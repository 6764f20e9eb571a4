"""A PyTorch defect torch:flex steers clear of: FlexAttention compiled on the CPU with torch.compile's automatic
dynamic shapes generates C++ that does not compile once a call recompiles for dynamic sizes ("'cur_qSplitSize8'
was not declared in this scope", torch 2.13). The adapter compiles with dynamic=False on the CPU, which runs the
same calls.

The calls are those of the CPU campaign that found it (reports/variants-2026-12-02-run2/flex-cpu/, seed 2, on
the adapter before dynamic=False): its first two cases rebuilt from the campaign's case log, with the exact
properties' reruns, then its saved third case. Skipped without a C++ compiler (the compiled path needs one)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

import flashcheck
import flashcheck.kernels.flex as flex
from flashcheck import AttentionCase, Variant
from flashcheck.inputs.case import load_case
from flashcheck.judge.properties import PROPERTIES

pytestmark = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")),
                                reason="torch.compile on the CPU needs a C++ compiler")

FOUND = Path(__file__).parents[2] / "reports" / "variants-2026-12-02-run2" / "flex-cpu" / \
    "torch-flex-crash-found-8ae776b732.json"


def _campaign_cases() -> list[AttentionCase]:
    g = torch.Generator().manual_seed(0)

    def rnd(*shape, dtype=torch.float16):
        return torch.randn(*shape, generator=g).to(dtype)

    f32 = torch.float32
    first = AttentionCase.create(
        rnd(1, 6, 127, 178, dtype=f32), rnd(1, 6, 240, 178, dtype=f32), rnd(1, 6, 240, 131, dtype=f32),
        scale=0.0749532, causal="top_left",
        variant=Variant(softcap=30.0, alibi_slopes=rnd(1, 6, dtype=f32).abs() * 0.1,
                        attn_bias=rnd(1, 1, 1, 240, dtype=f32), window=(33, -1), chunk=64))
    mask = torch.ones(1, 1, 39, 15, dtype=torch.bool)
    mask[..., :3] = False
    second = AttentionCase.create(
        rnd(2, 8, 39, 149), rnd(2, 1, 15, 149), rnd(2, 1, 15, 28), scale=0.0819232, causal="bottom_right",
        attn_mask=mask, variant=Variant(softcap=30.0, alibi_slopes=rnd(2, 8, dtype=f32).abs() * 0.1,
                                        attn_bias=rnd(1, 1, 1, 15), window=(64, -1), chunk=128))
    return [first, second, load_case(FOUND)]


def test_automatic_dynamic_shapes_generate_cpp_that_does_not_compile(monkeypatch):
    fa = flex.flex_module()
    monkeypatch.setitem(flex._COMPILED, "cpu", torch.compile(fa.flex_attention))  # the adapter before dynamic=False
    verdicts = [flashcheck.check("torch:flex", case, device="cpu", properties=PROPERTIES) for case in _campaign_cases()]
    failed = [f for v in verdicts for f in v.findings if "CppCompileError" in f.diagnosis]
    assert verdicts[0].status == "PASS" and failed, [str(v) for v in verdicts]
    assert any("was not declared" in str((f.details or {}).get("traceback", "")) for f in failed)
