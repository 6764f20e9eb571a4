"""The defect models on a CUDA GPU: each names its planted bug in flashcheck's compiled Triton kernel, and the
real defects already classified in reports/ (PyTorch's SDPA backends, cuDNN, fla-core's decoding step, SGLang's
MLA decode, as installed) are named by the library unaided (tests/_defect_cases.py)."""

from __future__ import annotations

import importlib.util

import pytest

from flashcheck.defects import explain
from tests._defect_cases import REAL, explain_planted, planted
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

PLANTED = planted()
GPU_DEFECTS = [d for d in REAL if "cuda" in d.devices]


@pytest.mark.parametrize(("model", "bug"), PLANTED, ids=[bug for _, bug in PLANTED])
def test_each_model_is_the_best_fit_to_its_planted_bug_compiled(model, bug):
    explained = explain_planted(bug, "cuda")
    assert explained.best is not None and explained.best.model == model, explained.line()


@pytest.mark.parametrize("defect", GPU_DEFECTS, ids=[d.label for d in GPU_DEFECTS])
def test_a_real_defect_is_named_by_the_library(defect):
    if defect.needs and importlib.util.find_spec(defect.needs) is None:
        pytest.skip(f"{defect.kernel} needs {defect.needs}")
    case, do = defect.load("cuda")
    explained = explain(defect.kernel, case, device="cuda", do=do)
    print(defect.label, "->", explained.line())
    assert defect.matches(explained.named), explained.line()
