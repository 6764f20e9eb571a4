"""``flashcheck.check_merge``: judge a split-KV merge of partial attention states against the float64 oracle
and the budget of a legal fp32 merge (:mod:`flashcheck.numerics.merge`), on drawn states of every regime of
:mod:`flashcheck.inputs.merge_states` (empty splits and rows with no live split included)."""

from __future__ import annotations

import math

import torch

from ..contract.counts import check_count
from ..contract.formats import format_of
from ..errors import InvalidArgument
from ..inputs.merge_states import MERGE_REGIMES, draw_states
from ..numerics.merge import merge_budget
from .verdict import BUG, Finding, Verdict

__all__ = ["LSE_BASES", "EMPTY_LSE", "check_merge"]

LSE_BASES = ("e", "2")
EMPTY_LSE = ("-inf", "+inf", "any")  # what a row with no live split may return as its lse


def check_merge(merge_fn, *, cases: int = 64, seed: int = 0, dtype="fp32", lse_base: str = "e",
                empty_lse: str = "-inf", max_splits: int = 16, rows: int = 8, head_dim: int = 64) -> Verdict:
    """The verdict on ``merge_fn(outs, lses) -> (out, lse)`` over ``cases`` drawn sets of partial states,
    the regimes taken in turn.

    ``outs`` is (S, R, Dv) in ``dtype``, ``lses`` (S, R) fp32 in ``lse_base`` ("e" or "2"), -inf for a split
    that saw no key; ``out`` (R, Dv), ``lse`` (R,) as the merge returns them, in the same base. A row with no
    live split must give out = 0 and the lse ``empty_lse`` says ("-inf", "+inf" or "any")."""
    fmt = format_of(dtype)
    check_count("cases", cases, fix="Pass cases=64 or more: a merge judged on no case is not a pass.")
    check_count("max_splits", max_splits, maximum=4096, fix="Pass max_splits=16 (splits drawn from 1 to it).")
    check_count("rows", rows, fix="Pass rows=8.")
    check_count("head_dim", head_dim, fix="Pass head_dim=64.")
    for name, value, known in (("lse_base", lse_base, LSE_BASES), ("empty_lse", empty_lse, EMPTY_LSE)):
        if value not in known:
            raise InvalidArgument(name, value, "unknown convention", f"Use one of {list(known)}.")
    if not callable(merge_fn):
        raise InvalidArgument("merge_fn", merge_fn, "not callable",
                              "Pass a function merge_fn(outs, lses) -> (out, lse).")
    regimes = list(MERGE_REGIMES)
    findings, worst = [], 0.0
    for index in range(cases):
        regime = regimes[index % len(regimes)]
        splits = 1 + (index * 7919 + seed) % max_splits
        outs, lses = draw_states(regime, seed=seed * 100003 + index, splits=splits, rows=rows, head_dim=head_dim,
                                 dtype=fmt.dtype)
        found, ratio = _judge(merge_fn, outs, lses, fmt, lse_base, empty_lse, f"{regime} S={splits}")
        findings += found
        worst = max(worst, ratio)
    return Verdict.from_findings(findings, max_ratio=worst, kernel=getattr(merge_fn, "__name__", repr(merge_fn)),
                                 case=f"{cases} merges, {fmt.name}, lse base {lse_base}")


def _judge(merge_fn, outs, lses, fmt, lse_base, empty_lse, where: str) -> tuple[list, float]:
    # Base 2: the merge gets lse log2(e) rounded to fp32, and the oracle merges exactly what it got.
    given = lses if lse_base == "e" else (lses.double() / math.log(2)).float()
    budget = merge_budget(outs, lses if lse_base == "e" else given.double() * math.log(2), dtype=fmt.dtype)
    try:
        out, lse = merge_fn(outs.clone(), given.clone())
    except Exception as exc:  # the merge's crash is a finding
        return [Finding("crash", BUG, f"{where}: merge_fn raised {type(exc).__name__}: {exc}", regime=where)], math.inf
    if tuple(out.shape) != tuple(budget.out.shape) or tuple(lse.shape) != tuple(budget.lse.shape):
        return [Finding("wrong_output", BUG, f"{where}: out {tuple(out.shape)} and lse {tuple(lse.shape)}, expected "
                        f"{tuple(budget.out.shape)} and {tuple(budget.lse.shape)}", regime=where)], math.inf
    lse = lse.double() * (1.0 if lse_base == "e" else math.log(2))
    found = _empty_rows(out, lse, budget, empty_lse, where)
    live = ~budget.empty
    err = (out.double() - budget.out).abs()[live]
    ratio = torch.where(err == 0, 0.0, err / budget.out_tol[live])
    got, exact = lse[live], budget.lse[live]
    lse_ratio = torch.where(got == exact, 0.0, (got - exact).abs() / budget.lse_tol[live])
    for name, r in (("out", ratio), ("lse", lse_ratio)):
        bad = ~(r <= 1.0)  # NaN is bad too
        if bool(bad.any()):
            top = float(r.nan_to_num(math.inf).max())
            found.append(Finding("over_budget" if name == "out" else "lse", BUG,
                                 f"{where}: merged {name} off the oracle by up to {top:.3g} times its budget at "
                                 f"{int(bad.sum())} of {bad.numel()} elements", regime=where, ratio=top))
    finite = [float(r[torch.isfinite(r)].max()) for r in (ratio, lse_ratio) if bool(torch.isfinite(r).any())]
    return found, max(finite, default=0.0)


def _empty_rows(out, lse, budget, empty_lse: str, where: str) -> list:
    """A row with no live split: out exactly 0, and the lse of the declared convention."""
    rows = budget.empty
    if not bool(rows.any()):
        return []
    found = []
    if not bool((out[rows] == 0).all()):
        found.append(Finding("masked_row_promise", BUG, f"{where}: a row with every split empty gives out "
                             f"{out[rows].flatten()[:3].tolist()}, not 0", regime=where))
    wanted = {"-inf": -math.inf, "+inf": math.inf}.get(empty_lse)
    if wanted is not None and not bool((lse[rows] == wanted).all()):
        found.append(Finding("lse", BUG, f"{where}: a row with every split empty gives lse "
                             f"{lse[rows][:3].tolist()}, the convention says {empty_lse}", regime=where))
    return found
