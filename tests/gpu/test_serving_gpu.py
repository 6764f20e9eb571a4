"""The serving forms on a CUDA GPU: the per-sequence references over PyTorch's flash backend pass on ragged batches
with empty sequences and pages of every size, and each planted bug of the forms is a BUG there too. PyTorch's
jagged SDPA keeps its H200 defects visible: fp16 and bf16 scores rounded to the dtype where the head dim is not a
multiple of 8 (its math composite without upcast; padded to 8, the same numbers pass), and NaN for a negative
scale (reports/serving-2026-12-02). flashcheck's own Triton kernels of the forms (varlen, paged, split-KV, MLA)
pass, on drawn cases too, and each of their planted bugs is a BUG."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.packing import PAGE_REGIMES, serving_case
from flashcheck.inputs.serving import ServingCase
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import planted_bugs, resolve_kernel

from tests._planted import first_catching_case

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


# The planted bugs of the forms' references, each with its form: varlen, paged or split-kv (a paged kernel).
FORM_BUGS = {bug: form for form in ("varlen", "paged", "split-kv") for bug in planted_bugs(f"torch:{form}")}


@pytest.mark.parametrize("mutant", sorted(FORM_BUGS))
def test_each_planted_bug_is_a_bug_on_the_gpu(mutant):
    form = FORM_BUGS[mutant]
    name = {"split-kv": "torch:split-kv"}.get(form) or KERNELS[form].replace("[", f"~{mutant}[")
    case = serving_case(_base(torch.float16), form="varlen" if form == "varlen" else "paged", packing="ragged",
                        pages="nondividing", poison="huge", seed=1,
                        seqused="slack" if mutant == "ignores_seqused_k" else "none")
    verdict = flashcheck.check(name if "~" in name else f"{name}~{mutant}", case, device="cuda")
    assert verdict.status == "BUG", str(verdict)


JAGGED = Path(__file__).parents[2] / "reports" / "serving-2026-12-02" / "h200" / "jagged-cases"


def _padded(case: ServingCase) -> ServingCase:
    """The same attention with the head dim zero-padded to a multiple of 8."""
    base, pad = case.base, -case.shapes.head_dim % 8
    q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (base.q, base.k, base.v))
    return ServingCase(AttentionCase.create(q, k, v, scale=base.scale), "varlen", case.q_lens, case.k_lens)


@pytest.mark.parametrize("path", sorted(JAGGED.glob("*over_budget-shrunk*.json")), ids=lambda p: p.stem[-10:])
def test_jagged_sdpa_rounds_half_scores_where_the_head_dim_is_not_a_multiple_of_8(path):
    case = load_case(path)
    verdict = flashcheck.check("torch:jagged", case, device="cuda", properties=())
    assert [f.kind for f in verdict.findings] == ["over_budget"], str(verdict)
    assert flashcheck.check("torch:jagged", _padded(case), device="cuda", properties=()).ok


def test_jagged_sdpa_gives_nan_for_a_negative_scale():
    case = load_case(next(JAGGED.glob("*nonfinite-shrunk*.json")))
    assert case.scale < 0
    verdict = flashcheck.check("torch:jagged", case, device="cuda", properties=())
    assert [f.kind for f in verdict.findings] == ["nonfinite"], str(verdict)
    positive = ServingCase(AttentionCase.create(case.base.q, case.base.k, case.base.v, scale=-case.scale), "varlen",
                           case.q_lens, case.k_lens)
    assert flashcheck.check("torch:jagged", positive, device="cuda", properties=()).ok


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("packing", ["ragged", "empty_sequences", "padded_max"])
def test_the_triton_varlen_kernel_passes_and_its_planted_bug_does_not(dtype, packing):
    base = _base(dtype)
    case = serving_case(base, form="varlen", packing=packing, pages="none", poison="nan", seed=5)
    verdict = flashcheck.check("flashcheck:triton-varlen", case, device="cuda")
    assert verdict.ok, str(verdict)
    wrong = flashcheck.check("flashcheck:triton-varlen~reads_past_end", case, device="cuda", properties=())
    assert wrong.status == "BUG", str(wrong)


# flashcheck's Triton kernels of the paged form, and the form (in FORM_BUGS) whose planted bugs they carry.
TRITON_PAGED = {"flashcheck:triton-paged": "paged", "flashcheck:triton-split-kv": "split-kv"}


@pytest.mark.parametrize("name", TRITON_PAGED)
def test_the_triton_paged_kernels_pass_drawn_cases(name):
    drawn = draw_recipes(40, seed=1, spec=resolve_kernel(name, device="cuda").spec)
    assert {r.pages for r in drawn} == set(PAGE_REGIMES)
    for recipe in drawn:
        verdict = flashcheck.check(name, recipe.build(), device="cuda")
        assert verdict.ok, str(verdict)


@pytest.mark.parametrize("name, mutant", [(name, mutant) for name, form in TRITON_PAGED.items()
                                          for mutant, of in sorted(FORM_BUGS.items()) if of == form])
def test_each_planted_bug_of_the_triton_paged_kernels_is_a_bug(name, mutant):
    case = serving_case(_base(torch.float16), form="paged", packing="ragged", pages="nondividing", poison="huge",
                        seed=1)
    verdict = flashcheck.check(f"{name}~{mutant}", case, device="cuda", properties=())
    assert verdict.status == "BUG", str(verdict)


def test_the_triton_mla_kernel_passes_drawn_cases_in_every_dtype():
    spec = resolve_kernel("flashcheck:triton-mla", device="cuda").spec
    drawn = draw_recipes(40, seed=1, spec=spec, max_n=300)
    assert {r.dtype for r in drawn} == {"fp16", "bf16", "fp32"}
    for recipe in drawn:
        verdict = flashcheck.check("flashcheck:triton-mla", recipe.build(), device="cuda")
        assert verdict.ok, str(verdict)


@pytest.mark.parametrize("mutant", sorted(planted_bugs("flashcheck:triton-mla")))
def test_each_planted_bug_of_the_triton_mla_kernel_is_caught_within_40_cases(mutant):
    kernel = resolve_kernel(f"flashcheck:triton-mla~{mutant}", device="cuda")
    assert first_catching_case(kernel, device="cuda", max_n=64) is not None, f"{kernel.name} passed 40 cases"
