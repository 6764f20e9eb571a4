"""Serving forms (varlen, paged): correct kernels pass on every length and page regime, each planted bug of
the forms is a BUG, the exact properties catch what the budget cannot, and saved cases replay bit-exactly."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.packing import LENGTH_REGIMES, PAGE_REGIMES, serving_case
from flashcheck.inputs.serving import ServingCase
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import planted_bugs, resolve_kernel

FORMS = {"varlen": "torch:varlen", "paged": "torch:paged"}


def _base(dtype=torch.float16, causal="bottom_right", batch=4, n_q=9, n_k=40, seed=0) -> AttentionCase:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, n_q, 32, generator=gen).to(dtype)
    k, v = (torch.randn(batch, 2, n_k, 32, generator=gen).to(dtype) for _ in range(2))
    return AttentionCase.create(q, k, v, scale=32 ** -0.5, causal=causal)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("packing", LENGTH_REGIMES)
def test_the_reference_kernels_pass_every_length_regime(form, packing):
    for causal in ("none", "bottom_right"):
        case = serving_case(_base(causal=causal), form=form, packing=packing, pages="nondividing", poison="huge",
                            seed=5)
        verdict = flashcheck.check(FORMS[form], case, device="cpu")
        assert verdict.ok, str(verdict)
        assert "isolation" in verdict.properties and "determinism" in verdict.properties


@pytest.mark.parametrize("pages", PAGE_REGIMES)
def test_pages_of_every_size_in_scrambled_order_pass_and_permute(pages):
    case = serving_case(_base(), form="paged", packing="ragged", pages=pages, poison="huge", seed=2)
    assert case.page_size == (int(pages) if pages != "nondividing" else case.page_size)
    if pages == "nondividing":
        assert all(n % case.page_size for n in case.k_lens if n)
    verdict = flashcheck.check("torch:paged", case, device="cpu")
    assert verdict.ok and "page_order" in verdict.properties, str(verdict)


# The planted bugs of the forms' references, each with its form: varlen, paged or split-kv (a paged kernel).
FORM_BUGS = {bug: form for form in ("varlen", "paged", "split-kv") for bug in planted_bugs(f"torch:{form}")}


@pytest.mark.parametrize("mutant", sorted(FORM_BUGS))
def test_each_planted_bug_of_the_forms_is_a_bug(mutant):
    kernel = FORM_BUGS[mutant]  # varlen, paged or split-kv (a paged kernel)
    form = "varlen" if kernel == "varlen" else "paged"
    # Pages of 4 over ragged lengths: every sequence crosses page boundaries, few fill their last page.
    case = serving_case(_base(), form=form, packing="ragged", pages="nondividing", poison="huge", seed=1,
                        seqused="slack" if mutant == "ignores_seqused_k" else "none")
    verdict = flashcheck.check(f"torch:{kernel}~{mutant}", case, device="cpu")
    assert verdict.status == "BUG", str(verdict)
    assert any(f.kind in ("over_budget", "nonfinite", "masked_row_promise") for f in verdict.findings)
    assert "sequence" in verdict.findings[0].diagnosis


def _leaky_varlen(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """Correct, plus a term far inside the budget that depends on every key of the batch."""
    out = _REFERENCE.fn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                        max_seqlen_k=max_seqlen_k, scale=scale, causal=causal)
    return out + (k.float().abs().sum() * 2.0**-60).to(out.dtype)


_REFERENCE = resolve_kernel("torch:varlen", device="cpu")


def test_isolation_finds_a_sequence_reading_another_sequences_keys_within_the_budget():
    kernel = flashcheck.kernel(_leaky_varlen, dtypes=("fp32",), form="varlen", causal=("none", "bottom_right"),
                               gqa=True, fully_masked_rows="zero", precision=_REFERENCE.spec.precision)
    case = serving_case(_base(torch.float32), form="varlen", packing="full", pages="none", poison="huge", seed=0)
    verdict = flashcheck.check(kernel, case, device="cpu")
    assert [f.kind for f in verdict.findings] == ["poison_leak"], str(verdict)
    assert verdict.max_ratio <= 1


def test_a_kernel_of_another_form_is_refused_by_name():
    case = serving_case(_base(), form="varlen", packing="ragged", pages="none", poison="huge", seed=0)
    with pytest.raises(InvalidArgument, match="declares form='paged'"):
        flashcheck.check("torch:paged", case, device="cpu")
    with pytest.raises(InvalidArgument, match="declares form='dense'"):
        flashcheck.check("torch:math", case, device="cpu")


def test_bad_lengths_and_shared_pages_are_refused():
    base = _base()
    with pytest.raises(InvalidArgument, match="q_lens"):
        ServingCase(base, "varlen", [9, 9, 9, 10], [1, 1, 1, 1])
    table = torch.zeros(4, 11, dtype=torch.int32)
    with pytest.raises(InvalidArgument, match="share a page"):
        ServingCase(base, "paged", [9] * 4, [5] * 4, page_size=4, block_table=table, num_blocks=8)


@pytest.mark.parametrize("form", FORMS)
def test_saved_serving_cases_keep_lengths_and_block_tables_bit_exactly(form, tmp_path):
    case = serving_case(_base(torch.bfloat16), form=form, packing="empty_sequences", pages="16", poison="nan", seed=3)
    case.save(tmp_path / "case")
    loaded = load_case(tmp_path / "case.json")
    assert isinstance(loaded, ServingCase) and loaded.equal_bits(case)
    for a, b in zip(case.physical("cpu").tensors, loaded.physical("cpu").tensors):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("form", FORMS)
def test_recipes_for_a_serving_kernel_draw_its_form_and_every_regime(form):
    spec = resolve_kernel(FORMS[form], device="cpu").spec
    drawn = draw_recipes(40, seed=1, spec=spec, max_n=48)
    assert {r.form for r in drawn} == {form}
    assert {r.packing for r in drawn} == set(LENGTH_REGIMES)
    cases = [r.build() for r in drawn[:6]]
    assert all(isinstance(c, ServingCase) and c.form == form for c in cases)
    if form == "paged":
        assert {r.pages for r in drawn} == set(PAGE_REGIMES)
        assert max(r.shapes.n_q for r in drawn) <= 16


def test_a_sequence_without_keys_is_judged_by_the_fully_masked_promise():
    case = ServingCase(_base(causal="none"), "varlen", [9, 3, 0, 2], [0, 40, 7, 1])
    verdict = flashcheck.check("torch:varlen", case, device="cpu")
    assert verdict.ok, str(verdict)
    empty = case.groups[0]
    assert empty.indices == (0,) and bool(empty.case.empty_rows().all())
    assert math.isfinite(verdict.max_ratio)


def test_each_sequence_keeps_its_own_slopes_and_the_shared_sinks():
    base = _base(batch=3)
    slopes, sinks = torch.arange(12, dtype=torch.float32).view(3, 4) + 1, torch.tensor([0.5, -1.0, 2.0, -math.inf])
    base = AttentionCase.create(base.q, base.k, base.v, scale=base.scale, causal=base.causal,
                                variant=flashcheck.Variant(alibi_slopes=slopes, sinks=sinks))
    case = ServingCase(base, "varlen", [9, 4, 9], [40, 7, 40])
    for group in case.groups:
        assert torch.equal(group.case.variant.alibi_slopes, slopes[list(group.indices)])
        assert torch.equal(group.case.variant.sinks, sinks)
    assert torch.equal(case.only(1).variant.alibi_slopes, slopes[1:2])
    with pytest.raises(InvalidArgument, match="takes no mask, no attn_bias or block_lists and the contiguous layout"):
        ServingCase(base.with_layout("transposed"), "varlen", [9] * 3, [40] * 3)
