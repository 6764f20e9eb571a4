"""The serving forms on a CUDA GPU: the per-sequence references over PyTorch's flash backend pass on ragged batches
with empty sequences and pages of every size, and each planted bug of the forms is a BUG there too."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import PAGE_REGIMES, serving_case
from flashcheck.kernels.serving import SERVING_MUTANTS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

KERNELS = {"varlen": "torch:varlen[backend=flash]", "paged": "torch:paged[backend=flash]"}


def _base(dtype=torch.bfloat16, causal="bottom_right") -> AttentionCase:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(6, 8, 16, 128, generator=gen).to(dtype)
    k, v = (torch.randn(6, 2, 700, 128, generator=gen).to(dtype) for _ in range(2))
    return AttentionCase.create(q, k, v, scale=128 ** -0.5, causal=causal)


@pytest.mark.parametrize("form", KERNELS)
@pytest.mark.parametrize("packing", ["ragged", "empty_sequences", "single_tokens"])
@pytest.mark.parametrize("pages", PAGE_REGIMES)
def test_the_references_over_flash_pass(form, packing, pages):
    if form == "varlen" and pages != "16":
        pytest.skip("pages are the paged form's")
    case = serving_case(_base(), form=form, packing=packing, pages=pages, poison="huge", seed=3)
    verdict = flashcheck.check(KERNELS[form], case, device="cuda")
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("mutant", sorted(SERVING_MUTANTS))
def test_each_planted_bug_is_a_bug_on_the_gpu(mutant):
    form = SERVING_MUTANTS[mutant][0]
    case = serving_case(_base(torch.float16), form=form, packing="ragged", pages="nondividing", poison="huge", seed=1)
    base, _, options = KERNELS[form].partition("[")
    verdict = flashcheck.check(f"{base}~{mutant}[{options}", case, device="cuda")
    assert verdict.status == "BUG", str(verdict)
