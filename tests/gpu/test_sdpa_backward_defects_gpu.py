"""Defects of PyTorch's fused SDPA backward kernels on a CUDA GPU, found by `fuzz --backward` campaigns and
kept visible: the shrunk cases (sdpa_backward_cases/), each beside a control input that differs in the one
quantity the classification names. When a PyTorch release fixes a defect its test fails, and
reports/results.md's table of defects needs its update. torch:math passes every case."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from flashcheck import AttentionCase, check_backward
from flashcheck.judge.backward import upstream_gradient
from tests._cases import cancelling_group_case

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CASES = Path(__file__).parent / "sdpa_backward_cases"


def _judge(kernel: str, case: AttentionCase, do: torch.Tensor):
    verdict = check_backward(kernel, case, do=do, device="cuda")
    print(f"{kernel:16} {case.describe()[:70]}: {verdict.status}, max error/budget {verdict.max_ratio:.3g}; "
          + "; ".join(f"{f.kind} {f.details.get('gradient')}" for f in verdict.findings))
    return verdict


def _case(name: str):
    case = AttentionCase.load(CASES / f"{name}.json")
    return case, upstream_gradient(case, "cuda")


def _nonfinite(verdict) -> bool:
    return any(f.kind == "nonfinite" for f in verdict.findings)


def test_flash_fp16_rounds_ds_to_fp16_and_overflows_past_65504():
    # |dS| = 8.0e4 here (every exact gradient below 530): dS rounded to fp16 is inf. Half of dO halves dS.
    case, do = _case("flash_fp16_ds_overflow")
    assert _nonfinite(_judge("torch:flash", case, do))
    assert _judge("torch:flash", case, do / 2).status == "PASS"
    assert _judge("torch:math", case, do).status == "PASS"


def test_efficient_fp16_scales_ds_before_rounding_it_and_overflows():
    # |dS| = 6.3e3 but |scale * dS| = 1.0e5 (scale 16): only the scaled dS passes fp16's range.
    case, do = _case("efficient_fp16_scaled_ds_overflow")
    assert _nonfinite(_judge("torch:efficient", case, do))
    assert _judge("torch:efficient", case, do / 2).status == "PASS"
    assert _judge("torch:math", case, do).status == "PASS"


@pytest.mark.parametrize("kernel", ["torch:efficient", "torch:cudnn"])
def test_tiny_scale_puts_scaled_ds_in_fp16_subnormals(kernel):
    # scale 2.5e-5: scale * dS near 2e-6, fp16 subnormals (spacing 6e-8); dO * 2^10 lifts them to normals.
    case, do = _case("fp16_tiny_scale")
    bad = _judge(kernel, case, do)
    assert bad.status == "BUG" and {f.details.get("gradient") for f in bad.findings} <= {"dq", "dk"}
    assert _judge(kernel, case, do * 1024).status == "PASS"
    assert _judge("torch:math", case, do).status == "PASS"


def test_cudnn_gives_nan_gradients_for_a_negative_scale():
    case, do = _case("cudnn_negative_scale")
    assert _nonfinite(_judge("torch:cudnn", case, do))
    positive = dataclasses.replace(case, scale=-case.scale)
    assert _judge("torch:cudnn", positive, upstream_gradient(positive, "cuda")).status == "PASS"
    assert _judge("torch:math", case, do).status == "PASS"


@pytest.mark.parametrize("kernel", ["torch:flash", "torch:efficient", "torch:cudnn"])
def test_gqa_rounds_each_query_heads_dk_share_to_fp16(kernel):
    # GQA: each query head's dK share is written in fp16 and the group summed afterwards (FA2's dk_expanded,
    # cuDNN alike; the efficient adapter repeats K and V). Shares of +-120,000 that cancel (exact dK 0) are
    # +-inf, summed NaN (benchmarks/gqa_share_probe.py: that model gives the H200's bits); shares of 19,200
    # pass. torch:math sums in fp32.
    case, do = cancelling_group_case()
    bad = _judge(kernel, case, do.cuda())
    assert {(f.kind, f.details.get("gradient")) for f in bad.findings} == {("nonfinite", "dk")}
    excluded = check_backward(kernel, case, do=do.cuda(), device="cuda", exclusions=True)
    assert excluded.skipped.startswith("excluded: group_share_past_range"), excluded.skipped
    control, small = cancelling_group_case(1.0)
    assert _judge(kernel, control, small.cuda()).status == "PASS"
    assert _judge("torch:math", case, do.cuda()).status == "PASS"
