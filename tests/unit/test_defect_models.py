"""The defect models on real kernels' defects (PyTorch's CPU flash backward, as installed) and the matching's
record: what it names, what it says when nothing fits or nothing ran, and its JSON."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck import AttentionCase, check_backward
from flashcheck.defects import MODELS, Explanation, Fit, explain
from flashcheck.defects.library import key_tiles
from tests._cases import cancelling_group_case
from tests._defect_cases import REAL


CPU_DEFECTS = [d for d in REAL if "cpu" in d.devices]


@pytest.mark.parametrize("defect", CPU_DEFECTS, ids=[d.model for d in CPU_DEFECTS])
def test_the_cpu_flash_backwards_defects_are_named(defect):
    """PyTorch's CPU flash backward, as installed: dS rounded to fp16 past 65,504 (dP = dO . V near 6e5), and
    GQA's dK shares of +-120,000 that cancel summed in fp16 one head after the other (+-inf; the H200's kernels
    round each share: NaN). Each is the model's, within the budget of its output."""
    case, do = defect.load("cpu")
    verdict = check_backward(defect.kernel, case, do=do, device="cpu")
    assert verdict.status == "BUG", str(verdict)
    explained = explain(defect.kernel, case, device="cpu", verdict=verdict, do=do)
    assert defect.matches(explained.named), explained.line()
    assert explained.best.fit <= 1.0 < explained.best.model_ratio, explained.line()


def test_the_group_share_control_passes():
    control, small = cancelling_group_case(1.0)  # every share at 19,200
    assert check_backward("torch:flash", control, do=small, device="cpu").status == "PASS"


def test_the_explanation_round_trips_through_json_and_says_what_it_names():
    fit = Fit("p_rounded", "bf16", "rounds P to bf16 before P @ V", 0.31, 12.0, 3210.0, 0.97, False, 64)
    assert fit.explains and fit.name == "p_rounded(bf16)"
    explained = Explanation([fit], tried=120, kernel_ratio=3210.0)
    again = Explanation.from_dict(explained.as_dict())
    assert again.fits == [fit] and again.named == "p_rounded(bf16)" and again.line() == explained.line()
    assert "0.31 against the model" in explained.line() and "3,210 against the oracle" in explained.line()
    nothing = Explanation(tried=120, kernel_ratio=math.inf)
    assert Explanation.from_dict(nothing.as_dict()).line() == "defect models: none of 120 matches (no known " \
                                                              "mistake gives this output)"


def test_a_fit_within_the_budget_does_not_explain_where_the_model_is_legal_or_the_twin_fits_as_well():
    assert not Fit("m", None, "s", 0.2, 0.9, 5.0).explains  # the model itself within the budget
    assert not Fit("m", None, "s", 0.6, 4.0, 1.0).explains  # the legal twin nearly as close
    assert Fit("m", None, "s", 0.6, 4.0, 1.0, bitwise=True).explains


def test_a_case_too_large_is_not_matched_and_says_so():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, n, 8, generator=g) for n in (4096, 2048, 2048))
    explained = explain("torch:math", AttentionCase.create(q, k, v, scale=0.3), device="cpu")
    assert explained.note.startswith("not run: the case has 8,388,608 scores") and explained.named is None
    assert explained.line().startswith("defect models: not run")


def test_every_model_is_described_and_tiles_cover_the_keys():
    assert len({m.name for m in MODELS}) == len(MODELS) >= 20
    for m in MODELS:
        for p in m.params:
            assert "{" not in m.describe(p), (m.name, p)
    assert key_tiles(10) == (16,) and key_tiles(40) == (16, 32, 64) and key_tiles(1000)[-1] == 128


def test_a_compiled_triton_sum_is_runs_in_order_then_a_halving_butterfly():
    from flashcheck.defects.library import _SUMS

    def fp16(x):
        return x.to(torch.float16).to(torch.float64)

    # fp16's spacing at 2048 is 2: 2048 + 1 is a tie that stays 2048, 2048 + 2 is 2050.
    terms = torch.tensor([2048.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    totals = {order: float(total(terms, fp16)) for order, total in _SUMS.items()}
    assert totals["runs of 4 in order, then pairwise"] == 2048.0  # 2048 + 1 + 1 + 1 in one thread: each 1 lost
    assert totals["runs of 2 in order, then pairwise"] == 2050.0  # (2048 + 1) + (1 + 1) meet: 2048 + 2
    assert totals["pairwise"] == 2050.0  # terms i and i + 4 first: 2048, 1, 1, 1; then 2048 + 1 and 1 + 1
    assert totals["in order"] == 2048.0


def test_a_fused_triton_sum_rounds_the_second_product_alone_and_fuses_the_others():
    from flashcheck.defects.library import _FUSED_SUMS, _SUMS

    def fp16(x):
        return x.to(torch.float16).to(torch.float64)

    # 1 + 2^-12 is no fp16 value: rounded alone it is 1, and 2048 + 1 is a tie that stays 2048; fused into the second
    # product (2048) unrounded, 2049.0002 is past the tie and rounds to 2050.
    terms = torch.tensor([1.0 + 2.0 ** -12, 2048.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    for order, total in _FUSED_SUMS.items():
        assert float(total(terms, fp16)) == 2050.0, order
        swapped = terms[[1, 0, 2, 3, 4, 5, 6, 7]]  # now 1 + 2^-12 is the one rounded alone: 2048 + 1 stays 2048
        assert float(total(swapped, fp16)) == 2048.0, order
    assert all(float(total(fp16(terms), fp16)) == 2048.0 for total in _SUMS.values())
