"""flashcheck.check_merge on a device and with the two-state convention: merge(out_a, lse_a, out_b, lse_b) -> (out,
lse), as FlashInfer's merge_state and vLLM's merge_attn_states, folded pairwise over S states. Correct two-state
merges in fp32, fp16 and bf16 stay inside the fold's budget over many drawn cases (its soundness), and wrong ones
are still BUGs."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.inputs.merge_states import draw_states
from flashcheck.numerics.merge import fold_budget, merge_budget

from ..repro.planted_merge import pair_fixed as _max_subtracting

LOG2E = 1 / math.log(2)


def _lse_domain(a, la, b, lb):
    """In the lse domain: each state's share a sigmoid of the lse difference, lse = max + log1p(e^-|la - lb|)."""
    empty = (la == -math.inf) & (lb == -math.inf)
    d = torch.where(empty, 0.0, la - lb)
    out = torch.sigmoid(d)[:, None] * a.float() + torch.sigmoid(-d)[:, None] * b.float()
    lse = torch.where(empty, -math.inf, torch.maximum(la, lb) + torch.log1p(torch.exp(-d.abs())))
    return out.to(a.dtype), lse


def _base2_inside(a, la, b, lb):
    """In base 2 inside, as FlashInfer's kernels compute: the lse times log2(e), exp2 and log2."""
    l2a, l2b = la * LOG2E, lb * LOG2E
    m = torch.maximum(l2a, l2b)
    safe = torch.where(m == -math.inf, 0.0, m)
    wa, wb = torch.exp2(l2a - safe), torch.exp2(l2b - safe)
    total = wa + wb
    out = (wa[:, None] * a.float() + wb[:, None] * b.float()) / torch.where(total > 0, total, 1.0)[:, None]
    return out.to(a.dtype), torch.where(total > 0, (safe + torch.log2(total)) / LOG2E, -math.inf)


CORRECT = {"max_subtracting": _max_subtracting, "lse_domain": _lse_domain, "base2_inside": _base2_inside}


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_two_state_merges_folded_over_many_cases_stay_inside_the_budget(name, dtype):
    verdict = flashcheck.check_merge(CORRECT[name], convention="pair", cases=120, dtype=dtype, seed=2)
    assert verdict.status == "PASS" and 0 < verdict.max_ratio <= 1, str(verdict)


def test_a_two_state_merge_in_base_2_passes_under_that_convention():
    def base2(a, la, b, lb):  # lse given and returned in base 2
        out, lse = _max_subtracting(a, la / LOG2E, b, lb / LOG2E)
        return out, lse * LOG2E

    assert flashcheck.check_merge(base2, convention="pair", lse_base="2", dtype="fp16", cases=48).status == "PASS"


def _no_max(a, la, b, lb):
    wa, wb = torch.exp(la), torch.exp(lb)
    total = wa + wb
    return ((wa[:, None] * a.float() + wb[:, None] * b.float()) / total[:, None]).to(a.dtype), torch.log(total)


def _lse_not_updated(a, la, b, lb):
    return _max_subtracting(a, la, b, lb)[0], la


_wrong_base = functools.partial(_max_subtracting, exp=torch.exp2, log=torch.log2)  # natural-log lse, base 2


def _no_empty_guard(a, la, b, lb):  # two empty states: e^(-inf - -inf) = NaN
    m = torch.maximum(la, lb)
    wa, wb = torch.exp(la - m), torch.exp(lb - m)
    total = wa + wb
    return ((wa[:, None] * a.float() + wb[:, None] * b.float()) / total[:, None]).to(a.dtype), m + torch.log(total)


@pytest.mark.parametrize("wrong, kinds", [(_no_max, {"over_budget"}), (_lse_not_updated, {"lse"}),
                                          (_wrong_base, {"over_budget", "lse"}),
                                          (_no_empty_guard, {"masked_row_promise"})])
def test_wrong_two_state_merges_are_bugs(wrong, kinds):
    verdict = flashcheck.check_merge(wrong, convention="pair", cases=32, dtype="fp16")
    assert verdict.status == "BUG" and kinds <= {f.kind for f in verdict.findings}, str(verdict)


@pytest.mark.parametrize("regime", ["random", "empty_splits", "huge_lse", "large_values"])
def test_one_fold_of_two_states_has_the_budget_of_a_merge_of_two(regime):
    outs, lses = draw_states(regime, seed=3, splits=2, rows=4, head_dim=8, dtype=torch.float16)
    fold, merge = fold_budget(outs, lses, dtype=torch.float16), merge_budget(outs, lses, dtype=torch.float16)
    for name in ("out", "lse", "empty", "out_tol", "lse_tol"):
        assert torch.equal(getattr(fold, name), getattr(merge, name)), name


def test_the_fold_budget_grows_with_each_fold_rounding_to_the_dtype():
    outs, lses = draw_states("ties", seed=0, splits=16, rows=4, head_dim=8, dtype=torch.float16)
    fold, merge = fold_budget(outs, lses, dtype=torch.float16), merge_budget(outs, lses, dtype=torch.float16)
    assert bool((fold.out_tol > 2 * merge.out_tol).all()) and bool((fold.lse_tol >= merge.lse_tol).all())


def test_the_merge_gets_its_states_on_the_device_and_as_the_convention_says():
    seen = []

    def recording(a, la, b, lb):
        seen.append((a.device, la.device, tuple(a.shape), tuple(la.shape), a.dtype, la.dtype))
        return _max_subtracting(a, la, b, lb)

    verdict = flashcheck.check_merge(recording, convention="pair", device=torch.device("cpu"), dtype="bf16",
                                     cases=8, rows=3, head_dim=5)
    assert verdict.status == "PASS", str(verdict)
    assert {s[:2] for s in seen} == {(torch.device("cpu"),) * 2}
    assert {s[2:] for s in seen} == {((3, 5), (3,), torch.bfloat16, torch.float32)}


@pytest.mark.parametrize("value", ["tpu", "cuda:x", 3, "meta"])
def test_a_bad_device_is_named(value):
    with pytest.raises(InvalidArgument, match=r"^device=.*Pass 'cpu', 'cuda'"):
        flashcheck.check_merge(_max_subtracting, convention="pair", device=value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
@pytest.mark.parametrize("value", ["cuda", "cuda:0", torch.device("cuda", 1)])
def test_cuda_without_a_gpu_is_refused_by_name(value):
    with pytest.raises(InvalidArgument, match=r"^device=.*torch sees no CUDA device"):
        flashcheck.check_merge(_max_subtracting, device=value)


@pytest.mark.parametrize("option, value, problem", [("convention", "tree", "unknown convention"),
                                                    ("max_splits", 1, "two states at least")])
def test_bad_pair_options_are_named(option, value, problem):
    with pytest.raises(InvalidArgument, match=f"^{option}=.*{problem}"):
        flashcheck.check_merge(_max_subtracting, **{"convention": "pair", option: value})
