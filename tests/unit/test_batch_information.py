"""A campaign counts the drawn cases the batch property judged, and those whose bits depended on the batch."""

from flashcheck.campaign.result import CampaignResult
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.verdict import Verdict

RECIPE = Recipe.from_dict({"shapes": {"batch": 2, "heads_q": 1, "heads_kv": 1, "n_q": 4, "n_k": 4, "head_dim": 16,
                                      "head_dim_v": 16}, "dtype": "fp16", "values": "random", "mask": "none",
                           "causal": "none", "scale": "default", "layout": "contiguous", "seed": 0})


def test_batch_information_counts_drawn_cases_with_the_batch_property():
    result = CampaignResult(verdict="PASS", kernel="k", device="cpu", preset="smoke", seed=0)
    judged = [(["batch"], [], True), (["batch"], ["batch-dependent: sequence 1 alone gave other bits"], True),
              ([], [], True), (["batch"], ["batch-dependent: ..."], False)]  # the last: a shrink candidate
    for properties, notes, drawn in judged:
        verdict = Verdict.from_findings([], max_ratio=0.5, properties=properties, notes=notes)
        result.count_case(verdict, "line", RECIPE, drawn=drawn)
    assert result.info["batch_checked"] == 2 and result.info["batch_dependent"] == 1
