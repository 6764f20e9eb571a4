"""The planted bugs are one catalog (kernels/planted.py, with flashcheck:triton's source edits beside its kernel):
each defect is one record with one description, whichever kernels carry it, and the table of built-ins, the
loader of flashcheck:triton's mutants and the self-test all read it."""

from __future__ import annotations

from collections import defaultdict

import pytest

from flashcheck.kernels import planted
from flashcheck.kernels.builtins import BUILTINS
from flashcheck.kernels.triton.mutants import known_mutants
from flashcheck.kernels.triton.planted import Mutant
from flashcheck.selftest.subjects import subjects


def test_a_planted_bug_two_kernels_carry_is_one_record():
    records = defaultdict(set)
    for entry in BUILTINS:
        for bug in entry.planted:
            records[bug.name].add(id(bug))
    assert records and all(len(ids) == 1 for ids in records.values()), records


def test_every_planted_bug_says_what_it_does_wrong():
    bugs = {bug for entry in BUILTINS for bug in entry.planted}
    assert all(isinstance(bug, (planted.PlantedBug, Mutant)) and bug.description for bug in bugs)
    assert {bug for bug in bugs if isinstance(bug, Mutant)} == set(planted.TRITON)


def test_the_mutant_loader_takes_the_catalogs_names():
    assert known_mutants() == tuple(m.name for m in planted.TRITON)


@pytest.mark.parametrize("backward", [False, True])
def test_the_selftest_rows_are_the_catalogs_with_its_descriptions(backward):
    rows = subjects("cpu", which="bugs", backward=backward)
    chosen = planted.SELFTEST_BACKWARD if backward else planted.SELFTEST
    builtins = [] if backward else [(f"{name}~{bug.name}", bug.description)
                                    for name, bugs in planted.SELFTEST_BUILTINS.items() for bug in bugs]
    assert [(r.name, r.description) for r in rows] == [(m.name, m.description) for m in chosen
                                                       if "cpu" in m.devices] + builtins
