"""flashcheck.check_merge: legal fp32 merges of split-KV partial states pass in every regime (the budget's
soundness sweep), and merges with the defects users reported are BUGs of the right kind."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.judge.merge import MergeOptions, check_merge
from flashcheck.numerics.merge import merge_reference


def _natural(outs, lses, *, base2=False):
    """A legal merge: weights relative to the max, fp32, one normalisation (natural log or base 2 inside)."""
    l = lses * (1 / math.log(2)) if base2 else lses
    m = l.amax(0)
    safe = torch.where(m == -math.inf, 0.0, m)
    w = torch.exp2(l - safe) if base2 else torch.exp(l - safe)
    total = w.sum(0)
    kept = torch.where(w[..., None] > 0, outs.float(), 0.0)  # an empty split's out is never read
    out = (w[..., None] * kept).sum(0) / torch.where(total > 0, total, 1.0)[..., None]
    lse = torch.where(total > 0, safe + (torch.log2(total) if base2 else torch.log(total)), -math.inf)
    return out.to(outs.dtype), lse * math.log(2) if base2 else lse


def _pairwise(outs, lses):
    """A legal merge as one two-way merge after another (vLLM's merge_attn_states), in fp32."""
    out, lse = outs[0].float(), lses[0]
    for o, l in zip(outs[1:], lses[1:]):
        m = torch.maximum(lse, l)
        safe = torch.where(m == -math.inf, 0.0, m)
        a, b = torch.exp(lse - safe), torch.exp(l - safe)
        total = a + b
        both = a[..., None] * out + b[..., None] * torch.where(b[..., None] > 0, o.float(), 0.0)
        out = torch.where(total[..., None] > 0, both / torch.where(total > 0, total, 1.0)[..., None], 0.0)
        lse = torch.where(total > 0, safe + torch.log(total), -math.inf)
    return out.to(outs.dtype), lse


def _shuffled(outs, lses):
    order = torch.randperm(outs.shape[0], generator=torch.Generator().manual_seed(outs.shape[0]))
    return _natural(outs[order], lses[order])


LEGAL = {"natural": _natural, "base2_inside": lambda o, l: _natural(o, l, base2=True), "pairwise": _pairwise,
         "shuffled": _shuffled}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(LEGAL))
def test_legal_merges_pass_in_every_regime(name, dtype):
    verdict = flashcheck.check_merge(LEGAL[name], cases=96, dtype=dtype, seed=1)
    assert verdict.status == "PASS" and 0 < verdict.max_ratio <= 1, str(verdict)


def test_a_merge_of_lse_in_base_2_passes_under_that_convention_and_fails_under_the_other():
    def base2(outs, lses):  # lse given and returned in base 2
        out, lse = _natural(outs, lses * math.log(2))
        return out, lse / math.log(2)

    assert flashcheck.check_merge(base2, lse_base="2", cases=32).status == "PASS"
    wrong = flashcheck.check_merge(base2, lse_base="e", cases=32)  # a base-2 merge fed natural-log lse
    assert wrong.status == "BUG" and {"over_budget", "lse"} <= {f.kind for f in wrong.findings}


def test_two_empty_splits_merged_into_nan_are_a_bug():
    def nan_on_empty(outs, lses):  # no guard: exp(-inf - -inf) = NaN
        m = lses.amax(0)
        w = torch.exp(lses - m)
        return ((w[..., None] * outs).sum(0) / w.sum(0)[..., None]).to(outs.dtype), m + torch.log(w.sum(0))

    verdict = flashcheck.check_merge(nan_on_empty, cases=16)
    assert verdict.status == "BUG" and any("every split empty" in f.diagnosis for f in verdict.findings)


def test_a_merge_without_the_max_overflows_on_large_lse():
    def no_max(outs, lses):
        w = torch.exp(lses)
        total = w.sum(0)
        return ((w[..., None] * outs).sum(0) / total[..., None]).to(outs.dtype), torch.log(total)

    verdict = flashcheck.check_merge(no_max, cases=16)
    assert verdict.status == "BUG" and any(f.regime.startswith(("huge_lse", "negative_lse")) for f in verdict.findings)


def test_an_lse_without_the_log_of_the_sum_and_an_empty_row_given_a_finite_lse_are_bugs():
    def max_only(outs, lses):
        out, _ = _natural(outs, lses)
        return out, lses.amax(0)

    def finite_on_empty(outs, lses):
        out, lse = _natural(outs, lses)
        return out, torch.where(lse == -math.inf, 0.0, lse)

    assert {f.kind for f in flashcheck.check_merge(max_only, cases=16).findings} == {"lse"}
    verdict = flashcheck.check_merge(finite_on_empty, cases=16)
    assert verdict.status == "BUG" and all("convention says -inf" in f.diagnosis for f in verdict.findings)
    assert flashcheck.check_merge(finite_on_empty, cases=16, empty_lse="any").status == "PASS"


def test_the_oracle_merges_exactly_where_the_answer_is_known():
    outs = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]], [[9.0, 9.0]]])
    lses = torch.tensor([[0.0], [0.0], [-math.inf]])
    out, lse, empty = merge_reference(outs, lses)
    assert out.tolist() == [[2.0, 3.0]] and lse.tolist() == [math.log(2)] and not bool(empty.any())


@pytest.mark.parametrize("option, value", [("cases", 0), ("lse_base", "10"), ("empty_lse", "nan"), ("max_splits", -1)])
def test_bad_options_name_the_argument(option, value):
    with pytest.raises(InvalidArgument, match=option):
        flashcheck.check_merge(_natural, **{option: value})


def test_options_come_as_a_record_or_as_keywords():
    options = MergeOptions(cases=6, seed=3, rows=4)
    assert check_merge(_natural, options).as_dict() == check_merge(_natural, cases=6, seed=3, rows=4).as_dict()
    assert check_merge(_natural, options, cases=3).case.startswith("3 merges")
    assert check_merge(merge_fn=_natural, cases=2).status == "PASS"


def test_an_unknown_option_is_named_with_the_known_ones():
    with pytest.raises(InvalidArgument, match=r"case=8: not an option of MergeOptions\. Use one of \['cases'") as e:
        flashcheck.check_merge(_natural, case=8)
    assert isinstance(e.value, TypeError)  # what Python raises for an unexpected keyword
    with pytest.raises(InvalidArgument, match="options=64: expected a MergeOptions"):
        flashcheck.check_merge(_natural, 64)


def test_the_options_are_checked_once_where_the_record_is_made():
    with pytest.raises(InvalidArgument, match="max_splits"):
        MergeOptions(convention="pair", max_splits=1)
    assert MergeOptions(device="cpu").device == torch.device("cpu")


@pytest.mark.parametrize("regime", ["random", "empty_splits", "dominant", "huge_lse", "negative_lse", "large_values"])
def test_mpmath_audits_the_float64_oracle_to_a_millionth_of_the_budget(regime):
    import mpmath

    from flashcheck.inputs.merge_states import draw_states
    from flashcheck.numerics.merge import merge_budget

    outs, lses = draw_states(regime, seed=5, splits=5, rows=3, head_dim=4, dtype=torch.float16)
    budget = merge_budget(outs, lses, dtype=torch.float16)
    with mpmath.workdps(50):
        for r in range(3):
            live = [s for s in range(5) if math.isfinite(float(lses[s, r]))]
            if not live:
                assert budget.empty[r] and float(budget.lse[r]) == -math.inf
                continue
            m = max(mpmath.mpf(float(lses[s, r])) for s in live)
            w = {s: mpmath.exp(mpmath.mpf(float(lses[s, r])) - m) for s in live}
            total = sum(w.values())
            lse = m + mpmath.log(total)
            assert abs(float(budget.lse[r]) - float(lse)) <= 1e-6 * float(budget.lse_tol[r])
            for d in range(4):
                exact = sum(w[s] * mpmath.mpf(float(outs[s, r, d])) for s in live) / total
                assert abs(float(budget.out[r, d]) - float(exact)) <= 1e-6 * float(budget.out_tol[r, d])
