"""The planted bugs of the defect models (kernels/triton/planted_defects.py): each is in the catalogue but not in the
self-test, and each is a BUG on a case that exposes it where the correct kernel passes (its model is named there in
test_defect_models.py)."""

from __future__ import annotations

import functools

import pytest

import flashcheck
from flashcheck.contract.formats import DTYPES
from flashcheck.defects.library import model_named
from flashcheck.kernels import planted
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant, mutant_source
from flashcheck.kernels.triton.planted import AREAS
from flashcheck.kernels.triton.planted_defects import DEFECT_MUTANTS
from tests._defect_cases import DEFECT_EXPOSURES, planted_probe

# The overflows past 65,504 that several cases are made of, as numpy reports them inside the interpreter.
pytestmark = [pytest.mark.interpreter, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

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


def test_the_half_precision_edits_compute_the_same_compiled():
    """What compiled Triton (3.6, 3.9) does otherwise: rewrite tl.sum of a broadcast product into a tl.dot (an MLIR
    assertion for fp16), fuse each product into its partial sum (an fma), promote half scores times the fp32 scale to
    fp32 where the interpreter keeps them half. Checked on the sources; tests/gpu runs them compiled."""
    for name in ("qk_sum_in_input_dtype", "q_prescaled_sum_in_input_dtype"):
        source = mutant_source(name)
        assert "for d in range(0, head_dim):" in source and "tl.sum(q[:, :, None]" not in source, name
        assert 'launch = {"enable_fp_fusion": False}' in source, name
    assert "* tl.cast(qk_scale, Q.dtype.element_ty)).to(tl.float32)" in mutant_source("scores_rounded_to_input_dtype")


# -- the exposing cases (tests/_defect_cases.py) ---------------------------------------------------------


def test_every_defect_mutant_has_an_exposing_case_and_a_model():
    assert set(DEFECT_EXPOSURES) == set(NAMES)
    for name, exposure in DEFECT_EXPOSURES.items():
        model = model_named(exposure.named.split("(")[0])
        assert model.backward == (BY_NAME[name].target == "backward"), name


@functools.cache
def _outcome(name: str):
    """(case, dO or None, the mutant's verdict, the correct kernel's verdict, the mutant) on the mutant's case."""
    case, do, block = planted_probe(name)
    options = dict(block_m=block, block_n=block, input_precision="ieee")
    mutant = load_mutant(name, **options)
    correct = make_kernel(**options)
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
