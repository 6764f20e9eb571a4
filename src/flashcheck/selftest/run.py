"""``flashcheck selftest``: the mutation suite that proves the error model works.

Planted-bug variants of ``flashcheck:triton`` (see :mod:`flashcheck.kernels.triton.mutants`) must each get BUG; the
correct kernel at several tile shapes and PyTorch's backends must get none. In the same run the anchor
rules of the field (:mod:`flashcheck.judge.anchors`) judge the same variants, on the same adversarial cases and
on plain randn inputs of the same shapes, so the gain is measured, not claimed.

``backward=True`` (``selftest --backward``) does the same for the backward pass: the planted backward
bugs, the correct kernels' gradients for a dO regime that follows from the case's seed (as in
``fuzz --backward``), and the anchors' backward rules.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from ..contract.features import FEATURES
from ..contract.spec import Kernel
from ..inputs.recipe import Recipe
from ..inputs.recipe_draws import draw_recipes
from ..judge.anchors import ANCHORS, BACKWARD_ANCHORS, GradientReferences
from ..judge.backward import (
    check_backward,
    drawn_backward_case,
    run_backward,
    upstream_gradient,
)
from ..judge.check import check
from ..judge.properties import properties_for
from ..judge.verdict import BUG, SUSPICIOUS, from_json_number, json_number, keep_largest
from .subjects import CORRECT_TILES, Variant, variants

__all__ = ["Variant", "variants", "run_selftest", "selftest_plan", "CORRECT_TILES", "RowRunner", "row_chunks",
           "merge_chunks", "DEFAULT_CHUNK"]

@dataclass
class Detection:
    """When one detector (flashcheck or an anchor rule) first flagged a variant, if it did."""

    first_case: int | None = None
    how: str = ""
    false_alarms: int = 0

    def flag(self, index: int, how: str) -> None:
        if self.first_case is None:
            self.first_case, self.how = index, how

    def as_dict(self) -> dict:
        return {"first_case": self.first_case, "how": self.how, "false_alarms": self.false_alarms}

    @classmethod
    def from_dict(cls, d: dict) -> "Detection":
        return cls(d["first_case"], d["how"], d["false_alarms"])


@dataclass
class Row:
    variant: str
    correct: bool
    area: str
    dtype: str
    cases: int = 0
    flashcheck: Detection = field(default_factory=Detection)
    anchors: dict = field(default_factory=dict)  # "rule/inputs" -> Detection
    max_ratio: float = 0.0  # correct variants: the margin
    min_caught_ratio: float = math.inf  # bug variants: the closest a caught case came to the budget
    suspicious: int = 0
    seconds: float = 0.0
    stopped: bool = False  # the time budget ran out before the row's cases did
    gradient_max: dict = field(default_factory=dict)  # the backward pass: largest err/budget of dq, dk, dv
    errors: int = 0  # cases flashcheck itself failed on (an exception in judging, not the kernel's)
    features: dict = field(default_factory=dict)  # variant feature -> judged cases that used it

    def as_dict(self) -> dict:
        return {"variant": self.variant, "correct": self.correct, "area": self.area, "dtype": self.dtype,
                "cases": self.cases, "flashcheck": self.flashcheck.as_dict(),
                "anchors": {k: v.as_dict() for k, v in self.anchors.items()},
                "max_ratio": json_number(self.max_ratio), "min_caught_ratio": json_number(self.min_caught_ratio),
                "suspicious": self.suspicious, "seconds": round(self.seconds, 2), "stopped": self.stopped,
                "gradient_max": {k: json_number(v) for k, v in self.gradient_max.items()}, "errors": self.errors,
                "features": dict(self.features)}

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        """A row saved by ``as_dict`` (``selftest --json``), so shards of one run print as one table."""
        return cls(d["variant"], d["correct"], d["area"], d["dtype"], d["cases"],
                   Detection.from_dict(d["flashcheck"]), {k: Detection.from_dict(v) for k, v in d["anchors"].items()},
                   from_json_number(d["max_ratio"]), from_json_number(d["min_caught_ratio"]), d["suspicious"], d["seconds"],
                   d.get("stopped", False), {k: from_json_number(v) for k, v in d.get("gradient_max", {}).items()},
                   d.get("errors", 0), dict(d.get("features", {})))


def _randn_twin(recipe: Recipe) -> Recipe:
    """The anchors' own inputs: randn values, no mask, default scale, same shapes and causal mode."""
    return dataclasses.replace(recipe, values="random", mask="none", scale="default", layout="contiguous")


def _run_variant(variant: Variant, kernel: Kernel, dtype: str, recipes: list[Recipe], device: str,
                 bug_cases: int, deadline: float | None, start: int = 0, stop: int | None = None,
                 fired=(), backward: bool = False, corpus: str | None = None) -> Row:
    """The row's cases ``start .. stop - 1`` (0-based; case ``i`` is numbered ``i + 1`` in the row).

    A whole row by default. A slice (a chunk, :func:`row_chunks`) runs the same cases as the whole row
    would, numbered alike; ``fired`` names the detectors that earlier chunks of a planted bug's row
    flagged already (:func:`fired_detectors`), so that the slice stops where the whole row would.
    """
    row = Row(variant.name, variant.correct, variant.area, dtype)
    for rule in (BACKWARD_ANCHORS if backward else ANCHORS):
        for inputs in ("randn", "adversarial"):
            row.anchors[f"{rule}/{inputs}"] = Detection()
    judge = _backward_case if backward else _forward_case
    begin = time.perf_counter()
    limit = len(recipes) if variant.correct else min(bug_cases, len(recipes))
    stop = limit if stop is None else min(stop, limit)
    for index, recipe in enumerate(recipes[start:stop], start=start + 1):
        # index > 1: a row runs its first case even past the deadline; a later chunk then runs none
        if deadline is not None and index > 1 and time.monotonic() > deadline:
            row.stopped = True
            break
        try:
            judge(row, kernel, recipe, index, device, corpus)
        except Exception:  # flashcheck failed on this case, not the kernel: said, counted, and the row goes on
            row.errors += 1
            print(f"flashcheck selftest: internal error on {row.variant} {dtype} case {index} ({recipe}):\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        if not variant.correct and all_fired(row, fired):
            break
    row.seconds = time.perf_counter() - begin
    return row


def _record(row: Row, verdict, index: int, recipe: Recipe) -> None:
    """flashcheck's verdict on the row's case ``index``, drawn from ``recipe``."""
    row.cases += 1
    for name in FEATURES:
        if getattr(recipe, name) != "none":
            row.features[name] = row.features.get(name, 0) + 1
    if math.isfinite(verdict.max_ratio):
        row.max_ratio = max(row.max_ratio, verdict.max_ratio)
    keep_largest(row.gradient_max, verdict.ratios)
    if verdict.status == SUSPICIOUS:
        row.suspicious += 1
    if verdict.status == BUG:
        kinds = "+".join(sorted({_kind(f) for f in verdict.findings}))
        row.flashcheck.flag(index, kinds)
        row.flashcheck.false_alarms += row.correct
        # How far past its budget the bug went on this case, to see how near it came to escaping.
        ratios = [f.ratio for f in verdict.findings if f.ratio is not None and math.isfinite(f.ratio)]
        if ratios:
            row.min_caught_ratio = min(row.min_caught_ratio, max(ratios))


def _kind(finding) -> str:
    """A finding's kind, with the gradient it concerns for the backward pass (``over_budget:dq``)."""
    gradient = (finding.details or {}).get("gradient")
    return f"{finding.kind}:{gradient}" if gradient else finding.kind


def _keep_false_alarm(row: Row, verdict, case, index: int, corpus: str | None) -> None:
    """A correct kernel's BUG or SUSPICIOUS saved under ``corpus`` the moment it is found, to replay and classify."""
    if corpus is not None and row.correct and verdict.status in (BUG, SUSPICIOUS):
        from ..campaign.corpus import save_finding

        label = f"selftest-{row.variant}-{row.dtype}-case{index}"
        save_finding(Path(corpus), verdict, case, label=label)


def _forward_case(row: Row, kernel: Kernel, recipe: Recipe, index: int, device: str, corpus=None) -> None:
    case = recipe.build(kernel=kernel.name)
    verdict = check(kernel, case, device=device, properties=properties_for(index - 1), envelope=row.correct)
    _record(row, verdict, index, recipe)
    _keep_false_alarm(row, verdict, case, index, corpus)
    _judge_anchors(row, kernel, case, verdict, index, device, recipe)


def _backward_case(row: Row, kernel: Kernel, recipe: Recipe, index: int, device: str, corpus=None) -> None:
    case = drawn_backward_case(recipe.build(kernel=kernel.name), recipe.seed)
    do = upstream_gradient(case, device)
    verdict = check_backward(kernel, case, do=do, device=device)
    _record(row, verdict, index, recipe)
    _keep_false_alarm(row, verdict, case, index, corpus)
    randn_case = _randn_twin(recipe).build(kernel=kernel.name)
    randn_do = upstream_gradient(randn_case, device, upstream="random", seed=recipe.seed)
    q, k, v, mask = randn_case.to_device(device)
    randn_run = run_backward(kernel, q, k, v, randn_do, scale=randn_case.scale, causal=randn_case.causal,
                             attn_mask=mask)
    for inputs, grads, c, d in (("adversarial", verdict.output, case, do), ("randn", randn_run.grads, randn_case, randn_do)):
        wanted = (c.q.shape, c.k.shape, c.v.shape)
        if grads is None or tuple(tuple(g.shape) for g in grads) != tuple(tuple(w) for w in wanted):
            for rule_name in BACKWARD_ANCHORS:
                _anchor_says(row, f"{rule_name}/{inputs}", index, False, "crash or wrong gradients")
            continue
        refs = GradientReferences(c, d, device)
        for rule_name, rule in BACKWARD_ANCHORS.items():
            _anchor_says(row, f"{rule_name}/{inputs}", index, rule(grads, refs))


def _anchor_says(row: Row, key: str, index: int, accepted: bool | None, how: str = "rejected") -> None:
    """Record one anchor rule's judgement of the row's case ``index`` (None: undefined here)."""
    det = row.anchors[key]
    if accepted is None:  # the rule is undefined here (flash-attention's rule on fp32)
        det.how = det.how or "n/a"
    elif not accepted:
        det.flag(index, how)
        det.false_alarms += row.correct


def fired_detectors(row: Row) -> frozenset:
    """The detectors done with this row: flashcheck once it flagged, an anchor once it flagged or found
    itself undefined ("n/a"). A planted bug's row ends once they all are."""
    done = {key for key, det in row.anchors.items() if det.first_case or det.how == "n/a"}
    return frozenset(done | ({"flashcheck"} if row.flashcheck.first_case else set()))


def all_fired(row: Row, fired=()) -> bool:
    """Whether every detector is done with ``row``, counting those ``fired`` (by earlier chunks) too."""
    done = fired_detectors(row) | set(fired)
    return "flashcheck" in done and all(key in done for key in row.anchors)


# ------------------------------------------------------------------------------------------------
# Chunks: slices of a row's cases, run apart (``selftest --jobs N``) and merged back into its row
# ------------------------------------------------------------------------------------------------

DEFAULT_CHUNK = 50      # cases per chunk (``selftest --chunk``)
BUG_FIRST_CHUNK = 12    # a planted bug's first chunk: most are caught by then


def row_chunks(correct: bool, cases: int, bug_cases: int, chunk: int = DEFAULT_CHUNK,
               first_bug_chunk: int = BUG_FIRST_CHUNK) -> list[tuple[int, int]]:
    """A row's cases as ``[start, stop)`` slices, in order: ``chunk`` cases each; a planted bug's first
    slice holds at most ``first_bug_chunk`` (its later slices run only while it is not caught)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    total = max(row_cases(correct, cases, bug_cases), 0)
    if total == 0:
        return [(0, 0)]
    bounds = [0, min(total, chunk if correct else min(chunk, first_bug_chunk))]
    while bounds[-1] < total:
        bounds.append(min(bounds[-1] + chunk, total))
    return list(zip(bounds, bounds[1:]))


def _merge_detections(dets: list[Detection]) -> Detection:
    flagged = [d for d in dets if d.first_case is not None]
    first = min(flagged, key=lambda d: d.first_case) if flagged else None
    how = first.how if first else ("n/a" if any(d.how == "n/a" for d in dets) else "")
    return Detection(first.first_case if first else None, how, sum(d.false_alarms for d in dets))


def merge_chunks(chunks: list[Row]) -> Row:
    """One row from the rows of its chunks (any order): what the whole row gives on the same cases.

    Cases, suspicious cases, false alarms and seconds add up; the largest ratio and the smallest caught
    ratio are kept; each detector's first case is the smallest of the chunks' (with its "how"); stopped
    if any chunk was.
    """
    if not chunks:
        raise ValueError("no chunks to merge")
    head = chunks[0]
    return Row(head.variant, head.correct, head.area, head.dtype,
               cases=sum(c.cases for c in chunks),
               flashcheck=_merge_detections([c.flashcheck for c in chunks]),
               anchors={key: _merge_detections([c.anchors[key] for c in chunks]) for key in head.anchors},
               max_ratio=max(c.max_ratio for c in chunks),
               min_caught_ratio=min(c.min_caught_ratio for c in chunks),
               suspicious=sum(c.suspicious for c in chunks),
               seconds=sum(c.seconds for c in chunks),
               stopped=any(c.stopped for c in chunks),
               gradient_max={k: max(c.gradient_max.get(k, 0.0) for c in chunks)
                             for k in sorted({k for c in chunks for k in c.gradient_max})},
               errors=sum(c.errors for c in chunks),
               features={k: sum(c.features.get(k, 0) for c in chunks)
                         for k in FEATURES if any(k in c.features for c in chunks)})


class RowRunner:
    """Runs chunks of the self-test's rows in one process (a ``selftest --jobs`` worker), keeping the
    kernels it built and the case lists it drew: the same cases as :func:`run_selftest` draws."""

    def __init__(self, *, device: str, cases: int = 200, bug_cases: int = 60, seed: int = 0, max_n: int = 160,
                 head_dims=None, backward: bool = False, corpus: str | None = None):
        self.device, self.cases, self.bug_cases = device, cases, bug_cases
        self.seed, self.max_n, self.head_dims, self.backward = seed, max_n, head_dims, backward
        self.corpus = corpus
        self._kernels: dict = {}
        self._recipes: dict = {}

    def variant(self, name: str) -> tuple[Variant, Kernel]:
        if name not in self._kernels:
            found = variants(self.device, names=[name], backward=self.backward)
            if not found:
                raise ValueError(f"no self-test variant named {name!r}")
            self._kernels[name] = (found[0], found[0].make())
        return self._kernels[name]

    def recipes(self, variant: Variant, kernel: Kernel, dtype: str) -> list[Recipe]:
        return _row_recipes(self._recipes, variant, kernel, dtype, cases=self.cases, bug_cases=self.bug_cases,
                            seed=self.seed, max_n=self.max_n, head_dims=self.head_dims)

    def run(self, name: str, dtype: str, start: int = 0, stop: int | None = None, fired=(),
            time_budget: float | None = None) -> Row:
        """Cases ``[start, stop)`` of the row ``(name, dtype)``, as a row of their own (see merge_chunks)."""
        deadline = None if time_budget is None else time.monotonic() + time_budget
        variant, kernel = self.variant(name)
        return _run_variant(variant, kernel, dtype, self.recipes(variant, kernel, dtype), self.device, self.bug_cases,
                            deadline, start=start, stop=stop, fired=fired, backward=self.backward,
                            corpus=self.corpus)


def row_cases(correct: bool, cases: int, bug_cases: int) -> int:
    """The most cases a row runs: ``cases`` for a correct kernel, ``bug_cases`` for a planted bug (which
    stops earlier once every detector fired), each whatever the other is."""
    return cases if correct else bug_cases


def _row_recipes(cache: dict, variant: Variant, kernel: Kernel, dtype: str, *, cases: int, bug_cases: int,
                 seed: int, max_n: int, head_dims) -> list[Recipe]:
    """A row's case list, drawn once per spec, dtype, features and length. A planted bug takes the first
    ``bug_cases`` of the correct rows' ``cases`` (the same cases), or a longer list of its own when it asks
    for more."""
    count = max(cases, row_cases(variant.correct, cases, bug_cases))
    key = (kernel.spec, dtype, variant.features, count)
    if key not in cache:
        cache[key] = draw_recipes(count, seed=seed, spec=kernel.spec, dtypes=[dtype], max_n=max_n, max_heads=4,
                                  head_dims=head_dims, variants=variant.features)
    return cache[key]


def _judge_anchors(row: Row, kernel: Kernel, case, verdict, index: int, device: str, recipe: Recipe) -> None:
    from ..judge.check import run_kernel

    adversarial_out = verdict.output[0] if verdict.output else None
    randn_case = _randn_twin(recipe).build(kernel=kernel.name)
    q, k, v, mask = randn_case.to_device(device)
    randn_run = run_kernel(kernel, q, k, v, scale=randn_case.scale, causal=randn_case.causal, attn_mask=mask)
    for rule_name, rule in ANCHORS.items():
        for inputs, out, c in (("adversarial", adversarial_out, case), ("randn", randn_run.out, randn_case)):
            key = f"{rule_name}/{inputs}"
            if out is None or not hasattr(out, "shape") or tuple(out.shape) != tuple(c.q.shape[:3]) + (c.v.shape[3],):
                _anchor_says(row, key, index, False, "crash or wrong output")
            else:
                _anchor_says(row, key, index, rule(out, c))


def run_selftest(*, device: str, dtypes=("fp16", "fp32"), cases: int = 200, bug_cases: int = 60, seed: int = 0,
                 max_n: int = 160, names: list[str] | None = None, which: str = "all",
                 head_dims=None, time_budget: float | None = None, progress=None, backward: bool = False,
                 corpus: str | None = None) -> list[Row]:
    """Each correct variant on ``cases`` drawn cases per dtype, each planted bug on up to ``bug_cases`` (it
    stops once every detector fired); the backward pass's variants and rules with ``backward``.

    ``time_budget`` (seconds) ends the run early: the row in progress and the ones after it stop after
    their first case and are marked ``stopped``, so a bug not yet caught reads as stopped, not missed.
    ``corpus``: a folder where each case a correct kernel fails (BUG or SUSPICIOUS) is saved as it is found.
    """
    deadline = None if time_budget is None else time.monotonic() + time_budget
    rows = []
    recipe_cache: dict = {}
    for variant, kernel, dtype in _rows(device, dtypes, names, which, backward):
        recipes = _row_recipes(recipe_cache, variant, kernel, dtype, cases=cases, bug_cases=bug_cases, seed=seed,
                               max_n=max_n, head_dims=head_dims)
        row = _run_variant(variant, kernel, dtype, recipes, device, bug_cases, deadline, backward=backward,
                           corpus=corpus)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def selftest_plan(*, device: str, dtypes=("fp16", "fp32"), names: list[str] | None = None,
                  which: str = "all", backward: bool = False) -> list[tuple[str, str]]:
    """The rows :func:`run_selftest` runs, in its order, as ``(variant name, dtype)`` pairs: each row's
    cases depend on the seed and the row alone, so rows may run apart (``selftest --jobs``)."""
    return [(variant.name, dtype) for variant, _, dtype in _rows(device, dtypes, names, which, backward)]


def _rows(device: str, dtypes, names, which, backward=False):
    for variant in variants(device, names=names, which=which, backward=backward):
        kernel = variant.make()
        for dtype in dtypes:
            if dtype in kernel.spec.dtypes and dtype in variant.dtypes:
                yield variant, kernel, dtype
