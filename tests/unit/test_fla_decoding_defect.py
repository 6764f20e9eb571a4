"""fla-core 0.6.0's ``attn_decoding_one_step`` sums each score in the input's half precision
(tests/_fla_decoding.py has the model and says why), which puts fp16 and bf16 over the flash contract's budget:
the H200 campaign's shrunk cases (reports/serving-2026-12-03) are over it in the model too, and the same order
with fp32 scores (the control) is inside it. The spec of ``fla:attn_decoding`` keeps half precision out of
campaigns; tests/gpu/test_fla_gpu.py keeps the kernel's own findings visible on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import load_case
from tests._fla_decoding import model_kernel

CASES = sorted((Path(__file__).parents[2] / "reports" / "serving-2026-12-03" / "h200" / "fla-decoding-cases")
               .glob("*.json"))


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_half_precision_scores_put_the_shrunk_cases_over_the_budget(path):
    case = load_case(path)
    assert case.dtype in ("fp16", "bf16")
    verdict = flashcheck.check(model_kernel(), case, device="cpu", properties=())
    assert {f.kind for f in verdict.findings} == {"over_budget"}, str(verdict)


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_the_same_order_with_fp32_scores_is_inside_it(path):
    verdict = flashcheck.check(model_kernel(torch.float32), load_case(path), device="cpu", properties=())
    assert verdict.ok, str(verdict)


def test_the_spec_keeps_half_precision_out_of_campaigns():
    from flashcheck.kernels.fla import decoding_spec

    assert decoding_spec("cuda").dtypes == ("fp32",)


# fla-core 0.6.0's outputs on these cases, compiled by Triton 3.6.0 on an NVIDIA H100 (torch 2.11.0+cu130): the same
# bits under each autotuned config of 1, 2 and 4 warps but one (reports/defects-2026-12-07/h100/).
H100 = Path(__file__).parent / "saved_cases" / "fla_h100"


def _h100_output(path):
    return torch.load(H100 / f"{path.stem[-10:]}.pt")


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_the_model_gives_the_h100s_output_bit_for_bit_but_for_fp32s_last_bits(path):
    """The scores in the kernel's order: of the three cases' 44,352 elements all but one are equal, that one a step of
    fp16 away, where the fp32 sums of P @ V run in another order (with the scores summed pairwise: 31, 35 and 94% equal)."""
    from flashcheck.judge.check import check

    got = check(model_kernel(), load_case(path), device="cpu", properties=(), envelope=False).output[0]
    expected = _h100_output(path)
    steps = (got.view(torch.int16).int() - expected.view(torch.int16).int()).abs()
    assert steps.max() <= 1 and (steps == 0).float().mean() >= 0.999, (steps.max(), (steps > 0).sum())


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem[-10:])
def test_the_defect_models_name_the_h100s_output(path):
    from flashcheck.contract.spec import Kernel
    from flashcheck.defects import explain
    from flashcheck.kernels.fla import DECODING_NAME, decoding_spec

    case, saved = load_case(path), _h100_output(path)
    replayed = Kernel(lambda q, k, v, **convention: saved.clone(), decoding_spec("cpu"), name=DECODING_NAME)
    explained = explain(replayed, case, device="cpu")
    order = "runs of 8 as multiply-adds from the second product, then pairwise"
    assert explained.best is not None and order in explained.best.param, explained.line()
    # At a power-of-two scale (0b4218709d's 0.25) prescaling rounds nothing: sums_in fits as well.
    best = {f.name for f in explained.fits if f.explains and f.fit == explained.best.fit}
    assert f"prescaled_sums_in({case.dtype},{order})" in best, explained.line()
