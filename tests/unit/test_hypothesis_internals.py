"""Each hypothesis internal flashcheck uses works on the installed hypothesis, not only its fallback: run with
another hypothesis version before widening flashcheck.hypothesis_internals.TESTED (and pyproject.toml's pin)."""

from __future__ import annotations

import time

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.errors import DeadlineExceeded

from flashcheck.campaign.database import PlannedDatabase
from flashcheck.campaign.engine import Failure, Shrink, hypothesis_test, run_test
from flashcheck.contract.spec import KernelSpec
from flashcheck.hypothesis_internals import draw_from_prefix, final_run, given_settings, set_given_settings
from flashcheck.inputs.covering import covering_plan, planned_choices
from flashcheck.inputs.recipe_draws import recipe_pools, recipes

SPEC = KernelSpec(attn_mask=True, causal=("none", "top_left"))


def test_a_prefix_of_choices_pins_the_first_draws():
    strategy = st.tuples(st.sampled_from("abcd"), st.sampled_from("xyz"), st.integers(0, 10**6))
    drawn = [draw_from_prefix(strategy, [3, 1], seed=s) for s in range(5)]
    assert all(d is not None and d.value[:2] == ("d", "y") for d in drawn)
    assert len({d.value[2] for d in drawn}) > 1  # the rest comes from the seed
    assert draw_from_prefix(strategy, [3, 1], seed=0) == drawn[0]


def test_every_planned_cell_is_drawn_and_replayed_as_planned():
    pools, strategy = recipe_pools(spec=SPEC, max_n=32), recipes(spec=SPEC, max_n=32)
    plan = covering_plan(pools, seed=1, limit=40)
    planned = [planned_choices(strategy, pools, cell, seed=i) for i, cell in enumerate(plan)]
    assert all(p is not None for p in planned)
    seen = []

    @settings(database=PlannedDatabase(InMemoryExampleDatabase(), planned[7].choices), max_examples=1,
              phases=[Phase.reuse], deadline=None)
    @given(recipe=strategy)
    def replay(recipe):
        seen.append(recipe)

    replay()
    assert seen == [planned[7].value]


def _stored_keys(digest: bytes) -> set:
    database, shrink = InMemoryExampleDatabase(), Shrink()

    def body(x):
        shrink.fail(x, x)

    run_test(hypothesis_test(body, given_args=dict(x=st.integers()), max_examples=5, seed=0, database=database,
                             phases=[Phase.generate], digest=digest), shrink)
    return set(database.data)


def test_a_digest_keys_the_database_entries_of_one_body():
    a, b = _stored_keys(b"tests/test_a.py::test[fp16]"), _stored_keys(b"tests/test_a.py::test[bf16]")
    assert a and b and not a & b
    assert _stored_keys(b"tests/test_a.py::test[fp16]") == a


def test_the_settings_of_a_given_test_are_replaced():
    @settings(deadline=50)
    @given(st.just(0))
    def slow(x):
        time.sleep(0.2)

    with pytest.raises(DeadlineExceeded):
        slow()
    set_given_settings(slow, settings(given_settings(slow), deadline=None))
    assert given_settings(slow).deadline is None
    slow()


def test_only_the_reported_run_is_final():
    finals = []

    @settings(database=None, deadline=None, max_examples=50)
    @given(st.integers(0, 100))
    def failing(x):
        finals.append(final_run())
        if x >= 10:
            raise Failure(x)

    with pytest.raises(Failure):
        failing()
    assert finals[-1] is True and finals.count(True) == 1
