"""A campaign over several dtypes gives each its share of the drawn cases.

Hypothesis's own draws are lumpy (its mutations and its target phase repeat one case's choices): 25 cases
over fp16 and fp32 once gave 22 fp16 and 3 fp32, which starves a sign-off cell (kernel x pass x dtype).
"""

from __future__ import annotations

import pytest

from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.inputs.presets import load_preset

DTYPES = ["fp16", "bf16", "fp32"]


def _campaign(tmp_path, *, cases: int, seed, dtypes=DTYPES, **options):
    return run_campaign(CampaignConfig(Target("torch:math", "cpu", load_preset("smoke"), dtypes)).replace(
        max_examples=cases, seed=seed, corpus=tmp_path / "corpus", isolate=False, **options))


@pytest.mark.parametrize("seed, cases", [(0, 30), (1, 45), (2, 60)])
def test_every_dtype_gets_a_fair_share_of_the_cases(tmp_path, seed, cases):
    result = _campaign(tmp_path, cases=cases, seed=seed)
    assert result.examples == cases and sum(result.by_dtype.values()) == cases
    assert set(result.by_dtype) == set(DTYPES)
    assert min(result.by_dtype.values()) >= cases / 4, dict(result.by_dtype)


def test_the_share_is_the_same_for_the_same_seed(tmp_path):
    a = _campaign(tmp_path / "a", cases=24, seed=5)
    b = _campaign(tmp_path / "b", cases=24, seed=5)
    assert a.case_log == b.case_log and a.by_dtype == b.by_dtype


def test_without_a_seed_the_database_replays_a_stored_case_of_any_dtype(tmp_path):
    # The share applies to drawn cases only: a stored failure in fp32 is replayed first, even though
    # no fp32 case is due yet, and hypothesis keeps it in the database.
    import flashcheck

    @flashcheck.kernel(dtypes=("fp16", "bf16", "fp32"))
    def broken_fp32(q, k, v, *, scale, causal, attn_mask=None):
        import torch

        out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
        return (out * (1.5 if q.dtype == torch.float32 else 1.0)).to(q.dtype)

    config = CampaignConfig(Target(broken_fp32, "cpu", load_preset("smoke"), DTYPES)).replace(
        max_examples=30, corpus=tmp_path / "corpus", reuse=True)
    first = run_campaign(config.replace(seed=3))
    shrunk = [f for f in first.findings if f["shrunk"]]
    assert first.verdict == "BUG" and shrunk and shrunk[0]["dtype"] == "fp32", first.findings
    again = run_campaign(config.replace(seed=4))
    assert again.verdict == "BUG" and again.examples == 1, (again.examples, again.case_log[:3])
    assert again.case_log[0].startswith(shrunk[0]["case"] + " ")


def test_a_single_dtype_campaign_is_unchanged_by_the_share(tmp_path):
    result = _campaign(tmp_path, cases=12, seed=0, dtypes=["fp32"])
    assert dict(result.by_dtype) == {"fp32": 12} and result.examples == 12


def _slow_and_wrong_in_fp16(q, k, v, *, scale, causal, attn_mask=None):
    import time

    import torch

    time.sleep(0.05)
    out = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale)
    return (out * (1.5 if q.dtype == torch.float16 else 1.0)).to(q.dtype)


def test_a_dtype_whose_time_share_is_spent_shrinking_leaves_the_others_theirs(tmp_path):
    import flashcheck

    kernel = flashcheck.kernel(_slow_and_wrong_in_fp16, dtypes=("fp16", "fp32"))
    result = run_campaign(CampaignConfig(Target(kernel, "cpu", load_preset("smoke"), ("fp16", "fp32"))).replace(
        max_examples=10_000, time_budget=8.0, seed=1, corpus=tmp_path / "corpus", keep_going=True))
    assert result.stopped == "time_budget" and result.verdict == "BUG"
    assert {f["dtype"] for f in result.findings} == {"fp16"}
    # fp32 has its half, 4 s, after fp16 shrank: cases of 50 ms and more on a loaded 2-core machine
    assert result.by_dtype["fp32"] >= 3, dict(result.by_dtype)
