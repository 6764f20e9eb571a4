"""``flashcheck selftest``: the mutation suite that proves the error model works.

Planted bugs in ``flashcheck:triton`` (see :mod:`flashcheck.kernels.triton.mutants`) must each get BUG; the
correct kernel at several tile shapes and PyTorch's backends must get none (the subjects:
:mod:`.subjects`). In the same run the anchor rules of the field (:mod:`flashcheck.judge.anchors`) judge the
same subjects, on the same adversarial cases and on plain randn inputs of the same shapes, so the gain is
measured, not claimed. Each subject in each dtype is a row (:mod:`.rows`).

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
from dataclasses import dataclass
from pathlib import Path

from ..campaign.corpus import save_finding
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
from ..judge.check import check, run_kernel
from ..judge.properties import properties_for
from ..judge.verdict import BUG, SUSPICIOUS, keep_largest
from .config import SelftestConfig
from .rows import Detection, Row, all_fired, row_cases
from .subjects import Subject, subjects

__all__ = ["RowPart", "RowRunner", "run_selftest", "selftest_plan"]


def _randn_twin(recipe: Recipe) -> Recipe:
    """The anchors' own inputs: randn values, no mask, default scale, same shapes and causal mode."""
    return dataclasses.replace(recipe, values="random", mask="none", scale="default", layout="contiguous")


@dataclass(frozen=True)
class RowPart:
    """Which of a row's cases to run: ``[start, stop)`` (0-based; case ``i`` is numbered ``i + 1`` in the
    row; ``stop`` None: to the end), ``fired``: the detectors earlier parts of a planted bug's row flagged
    already (:func:`~flashcheck.selftest.rows.fired_detectors`), ``deadline``: a ``time.monotonic()`` value
    past which no case but the row's first starts."""

    start: int = 0
    stop: int | None = None
    fired: tuple = ()
    deadline: float | None = None


def _run_row(subject: Subject, kernel: Kernel, dtype: str, recipes: list[Recipe], config: SelftestConfig,
             part: RowPart = RowPart()) -> Row:
    """The row's cases of ``part``: a whole row by default. A slice (a part,
    :func:`~flashcheck.selftest.rows.row_parts`) runs the same cases as the whole row would, numbered
    alike, and stops where the whole row would."""
    row = Row(subject.name, subject.correct, subject.area, dtype)
    for rule in (BACKWARD_ANCHORS if config.backward else ANCHORS):
        for inputs in ("randn", "adversarial"):
            row.anchors[f"{rule}/{inputs}"] = Detection()
    judge = _backward_case if config.backward else _forward_case
    begin = time.perf_counter()
    limit = len(recipes) if subject.correct else min(config.bug_cases, len(recipes))
    stop = limit if part.stop is None else min(part.stop, limit)
    for index, recipe in enumerate(recipes[part.start:stop], start=part.start + 1):
        # index > 1: a row runs its first case even past the deadline; a later part then runs none
        if part.deadline is not None and index > 1 and time.monotonic() > part.deadline:
            row.stopped = True
            break
        try:
            judge(row, kernel, recipe, index, config.device, config.corpus)
        except Exception:  # flashcheck failed on this case, not the kernel: said, counted, and the row goes on
            row.errors += 1
            print(f"flashcheck selftest: internal error on {row.variant} {dtype} case {index} ({recipe}):\n"
                  f"{traceback.format_exc()}", file=sys.stderr, flush=True)
        if not subject.correct and all_fired(row, part.fired):
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


class RowRunner:
    """Runs the self-test's rows, or parts of them (a ``selftest --jobs`` worker), in one process, keeping
    the kernels it built and the case lists it drew: a row's cases depend on the seed and the row alone."""

    def __init__(self, config: SelftestConfig):
        self.config = config
        self._kernels: dict = {}
        self._recipes: dict = {}

    def subject(self, name: str) -> tuple[Subject, Kernel]:
        if name not in self._kernels:
            found = subjects(self.config.device, names=[name], backward=self.config.backward)
            if not found:
                raise ValueError(f"no self-test subject named {name!r}")
            self._kernels[name] = (found[0], found[0].make())
        return self._kernels[name]

    def recipes(self, subject: Subject, kernel: Kernel, dtype: str) -> list[Recipe]:
        """A row's case list, drawn once per spec, dtype, features and length. A planted bug takes the first
        ``bug_cases`` of the correct rows' ``cases`` (the same cases), or a longer list of its own when it
        asks for more."""
        c = self.config
        count = max(c.cases, row_cases(subject.correct, c.cases, c.bug_cases))
        key = (kernel.spec, dtype, subject.features, count)
        if key not in self._recipes:
            self._recipes[key] = draw_recipes(count, seed=c.seed, spec=kernel.spec, dtypes=[dtype], max_n=c.max_n,
                                              max_heads=4, head_dims=c.head_dims, variants=subject.features)
        return self._recipes[key]

    def row(self, subject: Subject, kernel: Kernel, dtype: str, part: RowPart = RowPart()) -> Row:
        return _run_row(subject, kernel, dtype, self.recipes(subject, kernel, dtype), self.config, part)

    def run(self, name: str, dtype: str, start: int = 0, stop: int | None = None, fired=(),
            time_budget: float | None = None) -> Row:
        """Cases ``[start, stop)`` of the row ``(name, dtype)``, as a row of their own (see combine_parts)."""
        deadline = None if time_budget is None else time.monotonic() + time_budget
        subject, kernel = self.subject(name)
        return self.row(subject, kernel, dtype, RowPart(start, stop, tuple(fired), deadline))


def _judge_anchors(row: Row, kernel: Kernel, case, verdict, index: int, device: str, recipe: Recipe) -> None:
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


def run_selftest(config: SelftestConfig, progress=None) -> list[Row]:
    """Each correct subject on ``cases`` drawn cases per dtype, each planted bug on up to ``bug_cases`` (it
    stops once every detector fired); the backward pass's subjects and rules with ``backward``.

    ``time_budget`` (seconds) ends the run early: the row in progress and the ones after it stop after
    their first case and are marked ``stopped``, so a bug not yet caught reads as stopped, not missed.
    ``progress(row)`` is called as each row ends.
    """
    deadline = None if config.time_budget is None else time.monotonic() + config.time_budget
    runner = RowRunner(config)
    rows = []
    for subject, kernel, dtype in _rows(config):
        row = runner.row(subject, kernel, dtype, RowPart(deadline=deadline))
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


def selftest_plan(config: SelftestConfig) -> list[tuple[str, str]]:
    """The rows :func:`run_selftest` runs, in its order, as ``(subject name, dtype)`` pairs: each row's
    cases depend on the seed and the row alone, so rows may run apart (``selftest --jobs``)."""
    return [(subject.name, dtype) for subject, _, dtype in _rows(config)]


def _rows(config: SelftestConfig):
    for subject in subjects(config.device, names=config.names, which=config.which, backward=config.backward):
        kernel = subject.make()
        for dtype in config.dtypes:
            if dtype in kernel.spec.dtypes and dtype in subject.dtypes:
                yield subject, kernel, dtype
