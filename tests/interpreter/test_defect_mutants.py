"""The planted bugs of the defect models (kernels/triton/planted_defects.py): each is in the catalogue but not in the
self-test, each is a BUG on a case that exposes it where the correct kernel passes, and its defect model is the
best fit that flashcheck.defects.explain names there."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.contract.formats import DTYPES
from flashcheck.defects import explain
from flashcheck.defects.library import model_named
from flashcheck.defects.matching import explain_backward
from flashcheck.judge.backward import backward_case
from flashcheck.kernels import planted
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant
from flashcheck.kernels.triton.planted import AREAS
from flashcheck.kernels.triton.planted_defects import DEFECT_MUTANTS
from flashcheck.numerics.gradient_budget import gradient_budget
from tests._cases import cancelling_group_case

# The overflows past 65,504 that several cases are made of, as numpy reports them inside the interpreter.
pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

F16 = torch.float16
BLOCKS = {"block_m": 16, "block_n": 16}
NAMES = tuple(m.name for m in DEFECT_MUTANTS)
BY_NAME = {m.name: m for m in DEFECT_MUTANTS}


# -- the catalogue ------------------------------------------------------------------------------------


def test_the_defect_mutants_are_catalogued_but_stay_out_of_the_selftest():
    from flashcheck.selftest.subjects import subjects

    assert set(DEFECT_MUTANTS) <= set(planted.TRITON)
    assert not set(DEFECT_MUTANTS) & set(planted.SELFTEST + planted.SELFTEST_BACKWARD)
    names = {s.name for device in ("cpu", "cuda") for backward in (False, True)
             for s in subjects(device, which="bugs", backward=backward)}
    assert not set(NAMES) & names
    assert len(set(m.name for m in planted.TRITON)) == len(planted.TRITON)


def test_each_is_described_with_its_area_and_dtypes():
    # Their edits are checked with every other mutant's in test_mutants.py.
    for mutant in DEFECT_MUTANTS:
        assert mutant.area in AREAS and mutant.description and mutant.exposed_by and mutant.name.isidentifier()
        assert mutant.dtypes and set(mutant.dtypes) <= set(DTYPES), mutant.name


# -- the exposing cases -------------------------------------------------------------------------------


def _near_tied_large_logits(scale: float) -> AttentionCase:
    # q.k ~ 1024 (fp16's spacing 1 there; products near 64, spacing 2^-5) while the keys differ by a few units.
    gen = torch.Generator().manual_seed(6)
    q = (8 + 0.1 * torch.randn(1, 2, 16, 16, generator=gen)).to(F16)
    k = (8 + 0.1 * torch.randn(1, 2, 64, 16, generator=gen)).to(F16)
    v = torch.randn(1, 2, 64, 16, generator=gen).to(F16)
    return AttentionCase.create(q, k, v, scale=scale)


def _random_fp32() -> AttentionCase:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, n, 16, generator=gen) for n in (16, 64, 64))
    return AttentionCase.create(q, k, v, scale=0.25)


def _hidden_keys_far_above() -> AttentionCase:
    # Logits +40,000 on keys 0..15, which the mask hides from every row, and -40,000 on keys 16..31, some of them
    # visible: a hidden key's logit less 65,504 is still 14,496 above every visible one.
    gen = torch.Generator().manual_seed(2)
    q = torch.full((1, 1, 16, 16), 100.0)
    k = torch.full((1, 1, 32, 16), 100.0)
    k[:, :, 16:] = -100.0
    v = torch.randn(1, 1, 32, 16, generator=gen)
    mask = torch.rand(1, 1, 16, 32, generator=gen) < 0.5
    mask[..., :16] = False
    mask[..., 16] = True
    return AttentionCase.create(q.to(F16), k.to(F16), v.to(F16), scale=0.25, attn_mask=mask)


def _cancelling_rows(v: float, scale: float) -> tuple[AttentionCase, torch.Tensor]:
    # K = 0 (P = 1/2 on both keys), V = +-v, dO = 12.5 and two query rows of opposite signs: dS = +-100 v on each
    # row, so dQ = 0 and dK = scale (dS_0 - dS_1) = 0 exactly, whatever dS and scale x dS are.
    q = torch.ones(1, 1, 2, 16)
    q[:, :, 1] = -1.0
    k = torch.zeros(1, 1, 2, 16)
    values = torch.tensor([v, -v]).reshape(1, 1, 2, 1).expand(1, 1, 2, 16).contiguous()
    do = torch.full((1, 1, 2, 16), 12.5, dtype=F16)
    return AttentionCase.create(q.to(F16), k.to(F16), values.to(F16), scale=scale), do


def _peaked_subnormal_p() -> AttentionCase:
    # One key at logit 0, 31 at logit gaps of 10 to 16 (P from 4.5e-5 down to 1.1e-7: fp16's subnormals), and dO
    # along O (the "aligned" regime), so dS = P (dP - D) of the tiny weights carries their rounding.
    gen = torch.Generator().manual_seed(5)
    gaps = 10 + 6 * torch.rand(32, generator=gen)
    gaps[0] = 0.0
    q = torch.ones(1, 1, 8, 16)
    k = (-gaps / 4).view(1, 1, 32, 1).expand(1, 1, 32, 16).contiguous()
    v = torch.randn(1, 1, 32, 16, generator=gen)
    case = AttentionCase.create(q.to(F16), k.to(F16), v.to(F16), scale=0.25)
    return backward_case(case, upstream="aligned", seed=5)


@dataclass(frozen=True)
class Exposure:
    """A mutant's exposing case (and its dO, where the case's own upstream regime cannot give it), the kernel
    options both kernels run with, and the model's fit explain must name first."""

    named: str
    case: Callable[[], AttentionCase | tuple[AttentionCase, torch.Tensor]]
    options: dict = field(default_factory=lambda: dict(BLOCKS))


EXPOSURES = {
    "qk_products_in_input_dtype": Exposure("products_in(fp16)", lambda: _near_tied_large_logits(0.25)),
    "qk_sum_in_input_dtype": Exposure("sums_in(fp16)", lambda: _near_tied_large_logits(0.25)),
    "scores_rounded_then_promoted": Exposure("scores_rounded(fp16)", lambda: _near_tied_large_logits(0.25)),
    # A scale that is not a power of two: scale x q rounds.
    "q_prescaled_in_input_dtype": Exposure("q_prescaled(fp16)", lambda: _near_tied_large_logits(0.3)),
    # fp32 under the strict contract: the flash contract's tf32 allows fp16's rounding of l.
    "row_sum_rounded_to_fp16": Exposure("sum_rounded(fp16)", _random_fp32, dict(BLOCKS, input_precision="ieee")),
    "finite_mask_sentinel": Exposure("finite_sentinel(65504)", _hidden_keys_far_above),
    # scale x dS = +-80,000, past fp16's 65,504; dS itself 5,000.
    "scaled_ds_rounded_to_input_dtype": Exposure("scaled_ds_rounded(fp16)", lambda: _cancelling_rows(50.0, 16.0)),
    "p_rounded_for_ds": Exposure("p_rounded_for_ds(fp16)", _peaked_subnormal_p),
    # Each query head's dK share +-120,000 (past 65,504), the exact dK 0 (reports/gqa-share-2026-12-04).
    "group_shares_rounded": Exposure("group_share_rounded(fp16)", cancelling_group_case),
    # dS = +-100,000, past fp16's 65,504; scale x dS 6,250.
    "ds_rounded_to_fp16": Exposure("ds_rounded(fp16)", lambda: _cancelling_rows(1000.0, 1 / 16)),
}


def test_every_defect_mutant_has_an_exposing_case_and_a_model():
    assert set(EXPOSURES) == set(NAMES)
    for name, exposure in EXPOSURES.items():
        model = model_named(exposure.named.split("(")[0])
        assert model.backward == (BY_NAME[name].target == "backward"), name


@functools.cache
def _outcome(name: str):
    """(case, dO or None, the mutant's verdict, the correct kernel's verdict, the mutant) on the mutant's case."""
    exposure = EXPOSURES[name]
    made = exposure.case()
    case, do = made if isinstance(made, tuple) else (made, None)
    mutant = load_mutant(name, **exposure.options)
    correct = make_kernel(**exposure.options)
    if BY_NAME[name].target == "forward":
        verdicts = [flashcheck.check(k, case, device="cpu", properties=(), envelope=False) for k in (mutant, correct)]
    else:
        verdicts = [flashcheck.check_backward(k, case, device="cpu", do=do) for k in (mutant, correct)]
    return case, do, *verdicts, mutant


@pytest.mark.parametrize("name", NAMES)
def test_the_mutant_is_a_bug_where_the_correct_kernel_passes(name):
    _, _, bug, correct, _ = _outcome(name)
    assert bug.status == "BUG", f"{name}: {bug}"
    assert correct.status == "PASS", f"{name}: the correct kernel {correct}"


def _explained(name: str):
    case, do, bug, _, mutant = _outcome(name)
    if do is None:  # the forward, or a backward case whose dO its upstream regime gives
        return explain(mutant, case, device="cpu")
    budget = gradient_budget(case.q, case.k, case.v, do, scale=case.scale, causal=case.causal,
                             attn_mask=case.attn_mask, variant=case.variant, precision=mutant.spec.precision)
    return explain_backward(case, bug.output, budget, do, device="cpu")


# The interpreter sums tl.sum's fp16 products one after another along the head dim (numpy adds the reduced axis
# element by element, rounding each partial sum to fp16); the model sums them as a pairwise tree. The two orders
# round different partial sums, by as much as the defect moves the scores: the model is 48 budgets from the
# mutant here, where a sequential-order model fits it to 0 on 90% of the broken elements.
_SUM_ORDER = pytest.mark.xfail(strict=True, reason="sums_in models a pairwise sum; the interpreter's tl.sum of fp16 "
                                                   "products over the head dim is sequential")


@pytest.mark.parametrize("name", [pytest.param(n, marks=_SUM_ORDER) if n == "qk_sum_in_input_dtype" else n
                                  for n in NAMES])
def test_its_model_is_the_best_fit(name):
    explanation = _explained(name)
    assert explanation.named == EXPOSURES[name].named, explanation.line()
