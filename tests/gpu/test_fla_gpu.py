"""fla-core 0.6.0 compiled on an H200. Its parallel_attn: fp32 with 128-wide heads asks for more shared memory than
a Hopper GPU has and raises instead of computing, forward and backward (found by the H200 campaigns of
2026-12-02, reports/variants-2026-12-02-run2); fp32 at head dim 64 and fp16 at 128 are the controls. Its
attn_decoding_one_step sums scores in fp16 and bf16 (reports/serving-2026-12-03); fp32 is the control. Skipped
where fla-core is not installed, or on a GPU other than compute capability 9.0."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.inputs.case import load_case
from flashcheck.kernels.fla import make_fla_decoding_kernel
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON + [
    pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="fla-core is not installed"),
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                       reason="the shared memory limit measured is a Hopper GPU's (227 KiB)"),
]


def _case(dtype, head_dim: int) -> AttentionCase:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 33, head_dim, generator=gen).to(dtype) for _ in range(3))
    return AttentionCase.create(q, k, v, scale=head_dim ** -0.5, causal="top_left")


def test_fp32_with_head_dim_128_raises_out_of_shared_memory_forward_and_backward():
    case = _case(torch.float32, 128)
    for verdict in (flashcheck.check("fla:parallel_attn", case, device="cuda", properties=()),
                    flashcheck.check_backward("fla:parallel_attn", case, device="cuda")):
        assert verdict.status == "BUG" and [f.kind for f in verdict.findings] == ["crash"], str(verdict)
        assert "shared memory" in verdict.findings[0].diagnosis, str(verdict)


@pytest.mark.parametrize("dtype, head_dim", [(torch.float32, 64), (torch.float16, 128)])
def test_the_controls_run_and_pass(dtype, head_dim):
    case = _case(dtype, head_dim)
    assert flashcheck.check("fla:parallel_attn", case, device="cuda", properties=()).status == "PASS"
    assert flashcheck.check_backward("fla:parallel_attn", case, device="cuda").status == "PASS"


def test_the_decoding_step_passes_ragged_packed_batches_in_fp32():
    """fla-core's attn_decoding_one_step: every query of a ragged packed batch as a decoding step at the end of its
    key prefix, with and without a window (fp32, the one dtype its spec declares)."""
    from flashcheck.inputs.packing import serving_case

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 4, 3, 64, generator=gen)
    k, v = (torch.randn(4, 2, 300, 64, generator=gen) for _ in range(2))
    for window in (None, (31, 0)):
        base = AttentionCase.create(q, k, v, scale=0.125, causal="bottom_right",
                                    variant=flashcheck.Variant(window=window))
        case = serving_case(base, form="varlen", packing="ragged", pages="none", poison="huge", seed=3)
        verdict = flashcheck.check("fla:attn_decoding", case, device="cuda")
        assert verdict.ok, str(verdict)


DECODING = sorted((Path(__file__).parents[2] / "reports" / "serving-2026-12-03" / "h200" / "fla-decoding-cases")
                  .glob("*.json"))


@pytest.mark.parametrize("path", DECODING, ids=lambda p: p.stem[-10:])
def test_the_decoding_step_sums_scores_in_half_precision_so_it_is_over_the_budget(path):
    """The H200 campaign's shrunk fp16 and bf16 cases (outside the spec, which declares fp32): over the budget, as
    the CPU model of half-precision scores (tests/_fla_decoding.py) is; the same inputs in fp32 are the control."""
    case = load_case(path)
    kernel = make_fla_decoding_kernel(device="cuda")
    verdict = flashcheck.check(kernel, case, device="cuda", properties=())
    assert {f.kind for f in verdict.findings} == {"over_budget"}, str(verdict)
    base = case.base
    in_fp32 = AttentionCase.create(base.q.float(), base.k.float(), base.v.float(), scale=base.scale,
                                   causal=base.causal, variant=base.variant)
    assert flashcheck.check(kernel, dataclasses.replace(case, base=in_fp32), device="cuda", properties=()).ok
