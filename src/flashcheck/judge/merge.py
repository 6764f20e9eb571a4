"""``flashcheck.check_merge``: judge a split-KV merge of partial attention states against the float64 oracle
and the budget of a legal fp32 merge (:mod:`flashcheck.numerics.merge`), on drawn states of every regime of
:mod:`flashcheck.inputs.merge_states` (empty splits and rows with no live split included).

The merge takes S states at once or two at a time (:mod:`flashcheck.contract.merges`); a two-state merge is
folded pairwise over the S states (:func:`fold_states`) and judged against the fold's budget. The states are
drawn on the CPU and handed to the merge on its device; the judgement is made on the CPU, in float64."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from ..contract.counts import check_count
from ..contract.formats import device_named, format_of
from ..contract.merges import MergeConventions
from ..contract.forms import EMPTY_LSE_PROMISES, LSE_BASES
from ..errors import InvalidArgument
from ..files import check_writable_folder
from ..inputs.merge_case import MergeCase
from ..inputs.merge_states import MERGE_REGIMES, draw_states
from ..inputs.options import Options, keywords_of
from ..kernels.origin import kernel_origin
from ..numerics.merge import MergeBudget, fold_budget, merge_budget
from .verdict import BUG, Finding, Verdict

__all__ = ["LSE_BASES", "EMPTY_LSE", "MergeJudgement", "MergeOptions", "check_merge", "fold_states", "judge_merge"]

EMPTY_LSE = EMPTY_LSE_PROMISES  # what a row with no live split may return as its lse


@dataclass(frozen=True)
class MergeOptions(Options):
    """What :func:`check_merge` draws and how it calls the merge, checked here, once (the device as a torch
    device)."""

    cases: int = 64
    seed: int = 0
    dtype: str | torch.dtype = "fp32"
    lse_base: str = "e"
    empty_lse: str = "-inf"
    max_splits: int = 16
    rows: int = 8
    head_dim: int = 64
    device: str | torch.device = "cpu"
    convention: str = "states"
    save_dir: str | os.PathLike | None = None

    def __post_init__(self):
        format_of(self.dtype)
        check_count("cases", self.cases, fix="Pass cases=64 or more: a merge judged on no case is not a pass.")
        check_count("max_splits", self.max_splits, maximum=4096,
                    fix="Pass max_splits=16 (splits drawn from 1 to it).")
        check_count("rows", self.rows, fix="Pass rows=8.")
        check_count("head_dim", self.head_dim, fix="Pass head_dim=64.")
        if self.conventions.pairwise and self.max_splits < 2:
            raise InvalidArgument("max_splits", self.max_splits, "a two-state merge needs two states at least",
                                  "Pass max_splits=16 (states drawn from 2 to it).")
        object.__setattr__(self, "device", device_named(self.device))

    @property
    def conventions(self) -> MergeConventions:
        return MergeConventions(self.convention, self.lse_base, self.empty_lse)


@keywords_of(MergeOptions)
def check_merge(merge_fn, options: MergeOptions | None = None, **keywords) -> Verdict:
    """The verdict on ``merge_fn`` over ``cases`` drawn sets of partial states, the regimes taken in turn; the
    options (:class:`MergeOptions`) given whole, as keywords, or both.

    ``convention="states"``: ``merge_fn(outs, lses) -> (out, lse)``, ``outs`` (S, R, Dv) in ``dtype``, ``lses``
    (S, R) fp32; ``convention="pair"``: ``merge_fn(out_a, lse_a, out_b, lse_b) -> (out, lse)``, each out (R, Dv)
    and lse (R,), folded pairwise over 2 to ``max_splits`` states. The lse are in ``lse_base`` ("e" or "2"), -inf
    for a split that saw no key; ``out`` (R, Dv), ``lse`` (R,) as the merge returns them, in the same base. A row
    with no live split must give out = 0 and the lse ``empty_lse`` says ("-inf", "+inf" or "any"). The states
    reach the merge on ``device`` ("cpu", "cuda", "cuda:N"). ``save_dir``: where to save the states of a failing
    case (one per distinct set of finding kinds), for ``flashcheck repro``."""
    o = MergeOptions.of(options, keywords)
    fmt, conventions, device = format_of(o.dtype), o.conventions, o.device
    folder = None if o.save_dir is None else check_writable_folder("save_dir", o.save_dir)
    if not callable(merge_fn):
        raise InvalidArgument("merge_fn", merge_fn, "not callable",
                              f"Pass a function {conventions.signature} -> (out, lse).")
    regimes, saved = list(MERGE_REGIMES), {}
    findings, worst = [], 0.0
    for index in range(o.cases):
        regime = regimes[index % len(regimes)]
        low = 2 if conventions.pairwise else 1
        splits = low + (index * 7919 + o.seed) % (o.max_splits - low + 1)
        draw = o.seed * 100003 + index
        outs, lses = draw_states(regime, seed=draw, splits=splits, rows=o.rows, head_dim=o.head_dim, dtype=fmt.dtype)
        given = lses if o.lse_base == "e" else (lses.double() / math.log(2)).float()
        judged = judge_merge(merge_fn, outs, given, conventions, device=device, where=f"{regime} S={splits}")
        if folder is not None and judged.findings:
            _save(folder, saved, merge_fn, MergeCase(outs, given, conventions, {"regime": regime, "seed": draw,
                                                                                 "device": str(device)}), judged)
        findings += judged.findings
        worst = max(worst, judged.ratio)
    verdict = Verdict.from_findings(findings, max_ratio=worst, kernel=getattr(merge_fn, "__name__", repr(merge_fn)),
                                    case=f"{o.cases} merges, {fmt.name}, lse base {o.lse_base}"
                                    + (", two states at a time" if conventions.pairwise else ""))
    verdict.notes += [f"saved the states of a case with {', '.join(kinds)} as {path} (flashcheck repro {path} "
                      "--out DIR writes its reproducer)" for kinds, path in saved.items()]
    return verdict


def fold_states(merge_fn, outs, lses, empty_lse):
    """``merge_fn(out_a, lse_a, out_b, lse_b)`` folded over the states, ((s1 + s2) + s3) + ...: each merge's out
    goes on in the states' dtype and its lse in fp32. On a row whose states so far are all empty the lse goes on
    as -inf (an empty state's lse), whatever ``empty_lse`` the merge promises there. The last merge's result."""
    out, lse = merge_fn(outs[0], lses[0], outs[1], lses[1])
    live = (lses[0] > -math.inf) | (lses[1] > -math.inf)
    for o, l in zip(outs[2:], lses[2:]):
        carried = lse.to(torch.float32)
        if empty_lse != "-inf":
            carried = torch.where(live, carried, -math.inf)
        out, lse = merge_fn(out.to(outs.dtype), carried, o, l)
        live = live | (l > -math.inf)
    return out, lse


@dataclass
class MergeJudgement:
    """One set of states judged: the findings, the worst error / budget, the budget and the merge's out and its
    natural-log lse (float64, on the CPU; None after a crash or a wrong shape)."""

    findings: list
    ratio: float
    budget: MergeBudget
    out: torch.Tensor | None = None
    lse: torch.Tensor | None = None


def judge_merge(merge_fn, outs, lses, conventions: MergeConventions, *, device, where: str) -> MergeJudgement:
    """``merge_fn`` on the states ``outs`` and ``lses`` (as it gets them: in the conventions' base), on
    ``device``, against the float64 merge of exactly what it got."""
    natural = lses if conventions.lse_base == "e" else lses.double() * math.log(2)
    budget = (fold_budget if conventions.pairwise else merge_budget)(outs, natural, dtype=outs.dtype)
    on_device = outs.to(device, copy=True), lses.to(device, copy=True)
    try:
        if conventions.pairwise:
            out, lse = fold_states(merge_fn, *on_device, conventions.empty_lse)
        else:
            out, lse = merge_fn(*on_device)
    except Exception as exc:  # the merge's crash is a finding
        crash = Finding("crash", BUG, f"{where}: merge_fn raised {type(exc).__name__}: {exc}", regime=where)
        return MergeJudgement([crash], math.inf, budget)
    shapes = [tuple(getattr(t, "shape", ())) if isinstance(t, torch.Tensor) else type(t).__name__ for t in (out, lse)]
    if shapes != [tuple(budget.out.shape), tuple(budget.lse.shape)]:
        return MergeJudgement([Finding("wrong_output", BUG, f"{where}: out {shapes[0]} and lse {shapes[1]}, expected "
                                       f"{tuple(budget.out.shape)} and {tuple(budget.lse.shape)}", regime=where)],
                              math.inf, budget)
    out = out.detach().cpu()
    lse = lse.detach().cpu().double() * (1.0 if conventions.lse_base == "e" else math.log(2))
    found, ratio = _compare(out, lse, budget, conventions.empty_lse, where)
    return MergeJudgement(found, ratio, budget, out, lse)


def _compare(out, lse, budget: MergeBudget, empty_lse: str, where: str) -> tuple[list, float]:
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


def _save(folder, saved: dict, merge_fn, case: MergeCase, judged: MergeJudgement) -> None:
    """Save ``case``, the first of its set of finding kinds, with the merge's origin and its verdict there."""
    kinds = tuple(sorted({f.kind for f in judged.findings}))
    if kinds in saved:
        return
    origin = kernel_origin(merge_fn)
    verdict = Verdict.from_findings(judged.findings, max_ratio=judged.ratio, case=case.describe(),
                                    kernel=getattr(merge_fn, "__name__", repr(merge_fn)))
    provenance = {**case.provenance, "merge_source": origin["kernel_source"],
                  "merge_import_root": origin["kernel_import_root"], "verdict": verdict.as_dict()}
    stem = folder / f"merge-{'-'.join(kinds)}-{case.provenance['regime']}-{case.provenance['seed']}"
    _, path = MergeCase(case.outs, case.lses, case.conventions, provenance).save(stem)
    saved[kinds] = path
    for finding in judged.findings:
        finding.details["case"] = str(path)
