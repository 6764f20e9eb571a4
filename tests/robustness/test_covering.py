"""Short campaigns see every regime first: the covering order, the coverage counts, and the exact
properties within their share of the time."""

from __future__ import annotations

import pytest

import flashcheck
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.campaign.share import PROPERTY_SHARE
from flashcheck.inputs.covering import covering_plan, covering_size, pairs_of
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.recipe_draws import MASK_ORDER, VALUE_ORDER, recipe_pools
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.twin import Tiling, twin_attention

DTYPES = ["fp16", "fp32"]


def _campaign(tmp_path, kernel="torch:math", *, cases: int, seed=1, **options):
    target = Target(kernel, "cpu", load_preset(options.pop("preset", "smoke")), DTYPES)
    return run_campaign(CampaignConfig(target).replace(max_examples=cases, seed=seed, corpus=tmp_path / "corpus",
                                                       isolate=False, **options))


def _pools():
    return recipe_pools(spec=resolve_kernel("torch:math", device="cpu").spec, dtypes=DTYPES)


def _singles(pools) -> int:
    """Cases the plan takes to draw every regime of every field once."""
    return len(pools["values"]) + max(len(v) for f, v in pools.items() if f != "values")


def test_the_singles_come_first_and_then_every_pair():
    pools = _pools()
    singles = _singles(pools)
    plan = covering_plan(pools, seed=3, limit=1000)
    for field, values in pools.items():
        assert {c[field] for c in plan[:singles]} == set(values), field
    covered = set().union(*({(a, c[a], b, c[b]) for a in c for b in c if a != b} for c in plan))
    assert pairs_of(pools, list(pools)) <= covered
    largest = sorted(len(v) for v in pools.values())[-2:]
    assert len(plan) <= 1.2 * largest[0] * largest[1]  # near the fewest pairs can take
    assert covering_plan(pools, seed=3, limit=1000) == plan and covering_plan(pools, seed=4, limit=1000) != plan
    assert covering_size(pools, singles + 6) == singles and covering_size(pools, 200) == 100
    assert covering_size(pools, 5) == 5


def test_a_campaign_judges_every_regime_within_its_first_cases(tmp_path):
    cases = _singles(_pools())
    result = _campaign(tmp_path, cases=cases, seed=5)
    assert result.examples == cases and result.by_status["PASS"] == cases
    judged = {}
    for counts in result.coverage.values():
        for field, values in counts.items():
            judged.setdefault(field, set()).update(v for v, n in values.items() if n)
    pools = _pools()
    for field in ("values", "mask", "causal", "scale", "layout", "dtype"):
        assert judged[field] == set(pools[field]), field
    again = _campaign(tmp_path / "again", cases=cases, seed=5)
    assert again.case_log == result.case_log  # the order follows from the seed


def _wrong_on_huge_logits(q, k, v, *, scale, causal, attn_mask=None):
    out, lse = twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, tiling=Tiling(32, 32))
    return (out * 1.01 if q.abs().amax() > 50 else out), lse


def test_a_planned_case_that_fails_is_saved_and_shrunk(tmp_path):
    kernel = flashcheck.kernel(_wrong_on_huge_logits, causal=("none", "top_left", "bottom_right"), attn_mask=True,
                               gqa=True, dv_equals_d=False, fully_masked_rows="zero")
    result = _campaign(tmp_path, kernel, cases=40, seed=2)
    found = [f for f in result.findings if not f["shrunk"]]
    shrunk = [f for f in result.findings if f["shrunk"]]
    assert result.verdict == "BUG" and found and shrunk, result.findings
    assert found[0]["examples_at"] <= covering_size(_pools(), 40), found[0]  # within the covering order
    assert found[0]["regime"].startswith("huge_logits/")
    assert shrunk[0]["elements"] < found[0]["elements"]  # hypothesis shrank it


def test_the_summary_counts_coverage_and_says_what_was_never_judged(tmp_path):
    summary = _campaign(tmp_path, cases=6, seed=1).as_dict()
    coverage = summary["coverage"]
    assert set(coverage) == set(DTYPES)
    assert set(coverage["fp16"]["mask"]) == set(MASK_ORDER) and set(coverage["fp16"]["values"]) == set(VALUE_ORDER)
    judged = sum(n for d in coverage.values() for n in d["dtype"].values())
    assert judged == summary["counts"]["by_status"].get("PASS", 0) == 6
    assert any(n == 0 for d in coverage.values() for n in d["values"].values())  # 6 cases cannot cover 13


def test_the_properties_stay_within_their_share_of_the_time(tmp_path):
    result = _campaign(tmp_path, cases=60, seed=3, preset="adversarial")
    properties = result.properties
    assert properties["share"] == PROPERTY_SHARE
    assert result.time_split["properties"] <= PROPERTY_SHARE * result.elapsed * 1.1, result.time_split
    assert properties["cases"]["poison"] >= 10 and properties["cases"]["layout"] >= 10, properties
    assert properties["cases"]["poison"] < result.examples  # not on every case


@pytest.mark.parametrize("kinds, expected", [({"poison_leak"}, True), ({"over_budget"}, False)])
def test_a_shrink_gets_the_properties_only_for_a_bug_of_theirs(kinds, expected):
    from flashcheck.campaign.share import PropertyShare

    share = PropertyShare()
    assert bool(share.choose(None, shrinking=frozenset(kinds))) is expected


def test_the_workers_of_jobs_share_one_plan(tmp_path):
    from ._run import fuzz

    code, summary = fuzz(tmp_path, "correct", "--jobs", "2", "--max-examples", "20", seed=4)
    assert code == 0 and summary["jobs"] == 2 and summary["examples"] == 20
    judged = set()
    for counts in summary["coverage"].values():
        judged |= {v for v, n in counts["values"].items() if n}
    assert judged == set(VALUE_ORDER)  # two plans of 10 would repeat the first regimes
