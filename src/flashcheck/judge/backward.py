"""Checking a kernel's backward pass: dQ, dK and dV through autograd, judged element by element against
the oracle's gradients and their budget (:mod:`flashcheck.numerics.gradient_budget`). Findings say which
gradient, and where (rows and heads for dQ, keys and K/V heads for dK and dV).

A kernel declares ``backward=True`` in its spec to be differentiable; flashcheck then calls
``torch.autograd.grad(out, (q, k, v), dO)``. ``deterministic_backward`` (default True) promises that
two identical backward calls give the same bits, and is checked.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from dataclasses import dataclass

import torch

from ..contract.formats import format_of
from ..contract.precision import Precision, precision_named
from ..contract.spec import BACKWARD_FIX, Kernel, as_kernel, promise_note
from ..errors import InvalidArgument
from ..features.registry import REGISTRY
from ..features.variant import check_variant
from ..inputs.case import AttentionCase
from ..inputs.regimes import UPSTREAM_REGIMES, make_upstream
from ..kernels.registry import resolve_kernel
from ..numerics.gradient_budget import GradientBudget, gradient_budget
from ..numerics.gradients import GRADIENTS, group_share_max
from ..numerics.oracle import reference_attention
from .anchors import anchor_outcomes
from .check import check, compilations_so_far, crash_verdict, record_compilations
from .diagnose import describe_ranges, diagnose_elements, first_index
from .phases import kernel_call
from .skips import Skip, raise_skip, skipped_verdict
from .verdict import BUG, Finding, Verdict

__all__ = ["BackwardRun", "run_backward", "compare_gradients", "check_backward", "backward_case", "is_backward_case",
           "judge_case", "drawn_backward_case", "upstream_gradient"]


def backward_case(case: AttentionCase, *, upstream: str, seed: int) -> AttentionCase:
    """``case`` marked as a backward case: its provenance names the dO regime and seed, so that a saved
    case replays its backward pass with the same upstream gradient."""
    if upstream not in UPSTREAM_REGIMES:
        raise InvalidArgument("upstream", upstream, "unknown dO regime", f"Use one of {sorted(UPSTREAM_REGIMES)}.")
    marks = {"pass": "backward", "upstream": upstream, "upstream_seed": int(seed)}
    return dataclasses.replace(case, provenance={**(case.provenance or {}), **marks})


def drawn_backward_case(case: AttentionCase, seed: int) -> AttentionCase:
    """The backward case a campaign or the self-test draws: its dO regime follows from the recipe's
    ``seed`` (replayable, no extra draw)."""
    regimes = sorted(UPSTREAM_REGIMES)
    return backward_case(case, upstream=regimes[seed % len(regimes)], seed=seed)


def upstream_gradient(case: AttentionCase, device, *, upstream: str | None = None, seed: int | None = None):
    """dO for ``case`` on ``device``: the ``upstream`` regime with ``seed`` (default: the case's own, see
    :func:`backward_case`, else ``"random"`` and 0), built from the exact forward output."""
    marks = case.provenance or {}
    upstream = upstream or marks.get("upstream") or "random"
    seed = seed if seed is not None else int(marks.get("upstream_seed") or 0)
    device = torch.device(device)
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    out = reference_attention(case.q.to(device), case.k.to(device), case.v.to(device), scale=case.scale,
                              causal=case.causal, attn_mask=mask, variant=case.variant).out
    return make_upstream(upstream, out=out, dtype=case.torch_dtype, seed=seed).to(device)


def is_backward_case(case: AttentionCase) -> bool:
    return (case.provenance or {}).get("pass") == "backward"


@dataclass
class BackwardRun:
    """What one backward call produced: (dq, dk, dv), the variant tensors' gradients the kernel returned
    (``extra``, by each feature's ``gradient`` name), or the exception it raised."""

    grads: tuple | None
    error: BaseException | None
    traceback: str | None
    seconds: float
    extra: dict = dataclasses.field(default_factory=dict)

    def named(self) -> dict:
        return {**dict(zip(GRADIENTS, self.grads)), **self.extra}


# The variant tensors whose gradients are judged where the kernel returns them.
_VARIANT_INPUTS = {f.name: f.gradient for f in REGISTRY if f.gradient}


def run_backward(kernel, q, k, v, do, *, scale, causal, attn_mask=None, **variant) -> BackwardRun:
    """Run the kernel forward with autograd and take dQ, dK, dV for ``do``, and the gradients of the
    variant's tensors that have one (each feature's ``gradient``) where the kernel gives them. What it raises
    is the run's error (a crash), except what makes the case one that cannot be judged:
    :class:`~flashcheck.judge.skips.Skip` then."""
    start = time.perf_counter()
    inputs = [t.detach().requires_grad_() for t in (q, k, v)]  # same storage and strides
    extra = {n: variant[n].detach().requires_grad_() for n in _VARIANT_INPUTS if n in variant}
    try:
        with torch.enable_grad(), kernel_call():  # autograd's backward runs the kernel's backward: its phase too
            result = kernel(*inputs, scale=scale, causal=causal, attn_mask=attn_mask, **{**variant, **extra})
            out = result[0] if isinstance(result, (tuple, list)) else result
            grads = torch.autograd.grad(out, inputs + list(extra.values()), do, allow_unused=True)
            if q.is_cuda:
                torch.cuda.synchronize(q.device)
    except Exception as exc:  # a crash is a finding, not flashcheck's failure
        raise_skip(exc, "the kernel's forward and backward")
        return BackwardRun(None, exc, traceback.format_exc(), time.perf_counter() - start)
    main = tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs))
    given = {_VARIANT_INPUTS[n]: g for n, g in zip(extra, grads[3:]) if g is not None}
    return BackwardRun(main, None, None, time.perf_counter() - start, given)


def _where(name: str, bad: torch.Tensor, budget: GradientBudget) -> str:
    shapes = budget.gradients.shapes
    if name in _VARIANT_INPUTS.values():
        where = [describe_ranges(torch.nonzero(bad.reshape(-1)).flatten().tolist()[:64])]
        return f"{int(bad.sum())} of {bad.numel()} elements (flat indices {where[0]} of shape {tuple(bad.shape)})"
    if name == "dq":
        return diagnose_elements(bad, shapes, None, budget.gradients.forward.empty_rows)
    keys = torch.nonzero(bad.any(-1).any(0).any(0)).flatten().tolist()
    heads = torch.nonzero(bad.any(-1).any(-1).any(0)).flatten().tolist()
    text = f"{int(bad.sum())} of {bad.numel()} elements; keys {describe_ranges(keys)} of {shapes.n_k}"
    return text + (f"; K/V heads {describe_ranges(heads)} of {shapes.heads_kv}" if shapes.heads_kv > 1 else "")


def compare_gradients(grads, budget: GradientBudget, *, regime: str | None = None) -> tuple[list[Finding], dict]:
    """Findings of a kernel's gradients against the oracle and the budget, and err/budget per gradient:
    ``grads`` is (dq, dk, dv) or a dict of those and the variant's gradients the kernel returned."""
    findings, worst = [], {}
    named = grads if isinstance(grads, dict) else dict(zip(GRADIENTS, grads))
    for name, got in named.items():
        exact, total = budget.gradients[name], budget.total[name]
        if tuple(got.shape) != tuple(exact.shape):
            findings.append(Finding("wrong_output", BUG, f"{name} has shape {tuple(got.shape)}, expected "
                                    f"{tuple(exact.shape)}", regime=regime, details={"gradient": name}))
            worst[name] = math.inf
            continue
        fmax = format_of(got.dtype).max_value
        got = got.detach().to(exact.device, torch.float64)
        # Infinity is a legal result where the budget's interval around the exact gradient reaches past
        # the dtype's largest value on that side (also where the exact gradient is 0: dS cancelling to
        # rounding noise that large scales carry past 65,504).
        overflow = ((got == torch.inf) & (exact + total > fmax)) | ((got == -torch.inf) & (exact - total < -fmax))
        # Where the oracle or its budget is NaN nothing can be judged, infinity neither (check_backward notes
        # how many): a budget is NaN where an unbounded term meets an exact 0, as with |bias| ~ 1e30 in fp32.
        unjudged = torch.isnan(total) | torch.isnan(exact)
        nonfinite = ~torch.isfinite(got) & ~overflow & ~unjudged
        err = (got - exact).abs()
        ratio = torch.where(~torch.isfinite(got) | (err == 0) | unjudged, torch.zeros_like(err), err / total)
        worst[name] = float(ratio.max()) if ratio.numel() else 0.0
        if bool(nonfinite.any()):
            idx = first_index(nonfinite)
            findings.append(Finding("nonfinite", BUG, f"{name} is {float(got[idx])} where the exact gradient is "
                                    f"finite: {_where(name, nonfinite, budget)}", index=idx, regime=regime,
                                    details={"gradient": name}))
        over = ratio > 1
        if bool(over.any()):
            idx = first_index(ratio == ratio.max())
            findings.append(Finding("over_budget", BUG, f"{name} over its budget: {_where(name, over, budget)}",
                                    index=idx, error=float(err[idx]), budget=budget.breakdown(name, idx),
                                    ratio=float(ratio[idx]), regime=regime,
                                    details={"gradient": name, "elements_over": int(over.sum())}))
    return findings, worst


def _nondeterminism(first: BackwardRun, second: BackwardRun, regime) -> list[Finding]:
    out = []
    again = second.named()
    for name, a in first.named().items():
        b = again.get(name, a)
        differ = a != b
        differ &= ~(torch.isnan(a) & torch.isnan(b))
        if bool(differ.any()):
            out.append(Finding("nondeterminism", BUG, f"{name}: {int(differ.sum())} of {differ.numel()} elements "
                               "differ between two identical backward calls "
                               f"({promise_note('deterministic_backward')})", regime=regime, details={"gradient": name}))
    return out


def check_backward(kernel, case: AttentionCase, *, do: torch.Tensor | None = None, upstream: str | None = None,
                   seed: int | None = None, device=None, precision: Precision | str | None = None,
                   exclusions: bool = False) -> Verdict:
    """Run ``kernel``'s backward on ``case`` for the upstream gradient ``do`` (default: the ``upstream``
    dO regime with ``seed``, which default to the case's own, see :func:`backward_case`, else
    ``"random"`` and 0) and judge dQ, dK and dV element by element.

    ``exclusions``: a case in a class of the spec's gradient exclusions (``backward_excludes``, see
    :data:`flashcheck.contract.spec.GRADIENT_EXCLUSIONS`) is skipped, not judged, as campaigns do; by default
    the verdict is the real one."""
    before = compilations_so_far()  # a Triton backward's compilations are its first call's time, not the kernel's
    return record_compilations(_judge_backward(kernel, case, do=do, upstream=upstream, seed=seed, device=device,
                                               precision=precision, exclusions=exclusions), before)


def _judge_backward(kernel, case: AttentionCase, *, do, upstream, seed, device, precision, exclusions) -> Verdict:
    upstream = upstream or (case.provenance or {}).get("upstream") or "random"
    kern: Kernel = as_kernel(kernel) if not isinstance(kernel, str) else _resolve(kernel, device)
    problem = kern.spec.backward_problem()
    if problem:
        raise InvalidArgument("kernel", kern.name, problem, f"{BACKWARD_FIX}.")
    if not isinstance(case, AttentionCase):
        raise InvalidArgument("case", case, "flashcheck checks the backward pass on dense cases only",
                              "Pass an AttentionCase (a serving-form case is checked forward, with flashcheck.check).")
    check_variant(case.variant, kern.spec, shapes=case.shapes, dtype=case.torch_dtype)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    contract = precision_named(precision) if precision is not None else kern.spec.precision
    regime = (case.provenance or {}).get("strategy")
    meta = dict(kernel=kern.name, case=case.describe() + f", dO {upstream}", regime=regime)
    if kern.spec.fully_masked_rows != "zero" and bool(case.empty_rows().any()):
        # Zero gradients on such rows follow from a zero output there; another promise defines none.
        reason = (f"unsupported: rows with no visible key, whose gradients fully_masked_rows="
                  f"{kern.spec.fully_masked_rows!r} leaves undefined")
        return Verdict.from_findings([], max_ratio=math.nan, skipped=reason, **meta)
    q, k, v, mask = case.to_device(device)
    exact = (case.q.to(device), case.k.to(device), case.v.to(device))
    kw = dict(scale=case.scale, causal=case.causal, attn_mask=mask)
    do = upstream_gradient(case, device, upstream=upstream, seed=seed) if do is None else do.to(device)
    call = dict(kw, **case.variant.kwargs(device))
    try:
        run = run_backward(kern, q, k, v, do, **call)
        again = None if run.error is not None else run_backward(kern, q, k, v, do, **call)  # a second identical call
    except Skip as skip:
        return skipped_verdict(skip, device, meta)
    if run.error is not None:
        return crash_verdict(run, regime, meta)
    t0 = time.perf_counter()
    budget = gradient_budget(*exact, do, **kw, precision=contract, variant=case.variant)
    shares = lambda: group_share_max(*exact, do, **kw, variant=case.variant)  # noqa: E731
    excluded = _gradient_exclusion(kern.spec, case, budget.gradients, shares) if exclusions else None
    if excluded:
        return Verdict.from_findings([], max_ratio=math.nan, skipped=f"excluded: {excluded}", **meta)
    findings, worst = compare_gradients(_judged(run, budget), budget, regime=regime)
    elapsed = {"kernel": run.seconds, "oracle": time.perf_counter() - t0}  # kernel: forward and backward
    notes = _ratio_notes(worst, budget) + _unreturned(run, budget)
    more_findings, more_notes = _second_call(kern, run, again, regime)
    findings, notes = findings + more_findings, notes + more_notes
    return Verdict.from_findings(findings, max_ratio=max(worst.values()), elapsed=elapsed, notes=notes,
                                 output=run.grads, ratios=worst, **meta)


def _judged(run: BackwardRun, budget: GradientBudget) -> dict:
    """The gradients to judge: dq, dk, dv, and the variant's that both the kernel and the oracle have."""
    named = run.named()
    return {n: named[n] for n in budget.gradients.names if n in named}


def _unreturned(run: BackwardRun, budget: GradientBudget) -> list[str]:
    return [f"information: the kernel returned no {n} (not judged)" for n in budget.gradients.names
            if n not in run.named()]


def _ratio_notes(worst: dict, budget: GradientBudget) -> list[str]:
    """Each gradient's largest err/budget, and how many of its elements could not be judged."""
    notes = [", ".join(f"{n} max error/budget {worst[n]:.3g}" for n in worst)]
    notes += [f"information: {count} elements of {n} not judged (the oracle or its budget is NaN there)"
              for n in worst
              if (count := int((torch.isnan(budget.total[n]) | torch.isnan(budget.gradients[n])).sum()))]
    return notes


def _second_call(kern: Kernel, first: BackwardRun, again: BackwardRun, regime) -> tuple[list[Finding], list[str]]:
    """Findings and notes of ``again``, a second identical call: a broken promise is a BUG; without the promise,
    what differs is reported."""
    if again.error is not None:
        return [Finding("crash", BUG, f"a second identical backward call raised {type(again.error).__name__}: "
                        f"{again.error}".splitlines()[0][:300], regime=regime,
                        details={"traceback": again.traceback})], []
    differ = _nondeterminism(first, again, regime)
    if kern.spec.deterministic_backward:
        return differ, []
    return [], [f"information: {f.diagnosis.split(' (the spec')[0]} (not promised)" for f in differ]


def _gradient_exclusion(spec, case: AttentionCase, grads, shares) -> str | None:
    """The class of the spec's gradient exclusions ``case`` falls in, described, or None. ``shares()`` gives
    the largest GQA group share (:func:`~flashcheck.numerics.gradients.group_share_max`), computed only when
    the spec excludes that class: it costs a second oracle walk."""
    fmax = format_of(case.torch_dtype).max_value
    found = {"ds_past_range": lambda: grads.ds_max, "scaled_ds_past_range": lambda: abs(case.scale) * grads.ds_max,
             "group_share_past_range": shares}
    what = {"ds_past_range": "|dS|", "scaled_ds_past_range": "|scale x dS|",
            "group_share_past_range": "|dK| or |dV| share of one query head (or their running sum over the group)"}
    for name, value in found.items():
        if name in spec.backward_excludes and value() > fmax:
            return f"{name} (an exact {what[name]} past {case.dtype}'s {fmax:.6g})"  # one reason per class: counted
    return None


def judge_case(kernel: Kernel, case: AttentionCase, *, device, properties, anchors: bool = False) -> Verdict:
    """The verdict on ``case``: its backward pass for a backward case (:func:`backward_case`), else its
    forward pass with ``properties`` (how campaigns and their worker processes judge a case, the spec's
    gradient exclusions applied). ``anchors``: the field's rules judge the same output too
    (``verdict.anchors``, timed as ``elapsed["anchors"]``)."""
    backward = is_backward_case(case)
    do = upstream_gradient(case, device) if backward and anchors else None  # one dO for both judges
    if backward:
        verdict = check_backward(kernel, case, do=do, device=device, exclusions=True)
    else:
        verdict = check(kernel, case, device=device, properties=properties)
    if anchors and not verdict.skipped:
        start = time.perf_counter()
        verdict.anchors = anchor_outcomes(case, verdict.output, device=device, do=do)
        verdict.elapsed["anchors"] = time.perf_counter() - start
    return verdict


def _resolve(name: str, device) -> Kernel:
    return resolve_kernel(name, device=torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type)
