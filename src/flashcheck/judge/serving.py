"""Checking a kernel of a serving form (varlen, paged) on a :class:`~flashcheck.inputs.serving.ServingCase`.

The kernel runs once on the physical form (packed or paged, every unowned element poisoned); its output is
unpacked per sequence and each group of equal-length sequences is judged against the oracle and budget of
its logical problem, as a dense case would be. The exact properties of the forms rerun it: the same call
again (determinism), the other sequences' keys poisoned (isolation: no sequence reads another's), the page
pool in another order (page order), and the last sequence alone (batch, where the spec promises it).
A kernel that quantizes inside has each group judged against the values its quantizer gives, a step over the
packed batch included (:mod:`flashcheck.inputs.serving_inside`); where that step reads every packed key, poisoning
other sequences' keys changes a sequence's codes, so isolation poisons their values alone.
A kernel that declines the case (:class:`~flashcheck.errors.Unsupported`) or runs out of device memory on any of
these calls, or at any split count, skips the case as a dense kernel does (:mod:`flashcheck.judge.skips`).
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback

import torch

from ..contract.spec import promise_note
from ..errors import InvalidArgument
from ..features.forms import Setting, form, settings
from ..inputs.serving import SequenceGroup, ServingCase
from ..inputs.serving_inside import as_quantized, reads_every_key
from ..numerics.budget import error_budget
from .comparison import compare, inputs_written, promises
from .phases import kernel_call
from .properties import differs
from .skips import one_line, raise_skip
from .verdict import BUG, Finding, Verdict

__all__ = ["SERVING_PROPERTIES", "SERVING_PROPERTY_FINDINGS", "check_serving", "group_budgets", "run_form"]

# Each property of the forms, in the order they run, and the finding kind it gives when it fails.
SERVING_PROPERTY_FINDINGS = {"determinism": "nondeterminism", "isolation": "poison_leak",
                             "page_order": "layout_dependence", "batch": "batch_dependence"}
SERVING_PROPERTIES = tuple(SERVING_PROPERTY_FINDINGS)


@dataclasses.dataclass
class FormRun:
    out: torch.Tensor | None
    lse: torch.Tensor | None
    error: BaseException | None
    traceback: str | None
    seconds: float
    device: torch.device | None = None  # where the inputs were (cuda:0 for "cuda")
    tensors: tuple = ()  # the three tensors the kernel was handed, as it left them


def run_form(kernel, case: ServingCase, device, *, setting: Setting | None = None,
             what: str = "the kernel") -> FormRun:
    """Call ``kernel`` (its plain function) on ``case``'s physical form (at ``setting``, for a split-KV kernel's
    split count). What it raises is the run's error (a crash), except what makes the case one that cannot be
    judged: :class:`~flashcheck.judge.skips.Skip` then, with ``what`` (which call) in its reason."""
    inputs = case.physical(device)
    splits = {} if setting is None else setting.keywords()
    start = time.perf_counter()
    try:
        with kernel_call():  # a death here is the kernel's
            result = kernel.fn(*kernel.spec.calling.arguments(*inputs.tensors), **inputs.kwargs, scale=case.scale,
                               causal=case.causal, **case.variant_kwargs(device), **splits)
            if inputs.tensors[0].is_cuda:
                torch.cuda.synchronize(device)
    except Exception as exc:  # a crash is a finding
        raise_skip(exc, what)
        return FormRun(None, None, exc, traceback.format_exc(), time.perf_counter() - start)
    out, lse = result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None)
    return FormRun(out, lse, None, None, time.perf_counter() - start, inputs.tensors[0].device, inputs.tensors)


def _shape_problems(run: FormRun, case: ServingCase) -> list[Finding]:
    want_out, want_lse, device = *case.output_shapes(), run.device
    problems = []
    if not isinstance(run.out, torch.Tensor):
        problems.append(f"returned {type(run.out).__name__}, not a tensor")
    elif tuple(run.out.shape) != want_out or run.out.dtype != case.torch_dtype or run.out.device != device:
        problems.append(f"out is {tuple(run.out.shape)} {run.out.dtype} on {run.out.device}, expected {want_out} "
                        f"{case.torch_dtype} on {device}")
    if run.lse is not None and (not isinstance(run.lse, torch.Tensor) or tuple(run.lse.shape) != want_lse):
        problems.append(f"lse has shape {tuple(getattr(run.lse, 'shape', ()))}, expected {want_lse}")
    return [Finding("wrong_output", BUG, p) for p in problems]


def _where(case: ServingCase, group: SequenceGroup) -> str:
    n_q, n_k = case.q_lens[group.indices[0]], case.k_lens[group.indices[0]]
    which = f"sequence {group.indices[0]}" if len(group.indices) == 1 else f"sequences {list(group.indices)}"
    return f"{which} of {len(case.q_lens)} ({n_q} queries, {n_k} keys)"


def _in_batch(finding: Finding, case: ServingCase, group: SequenceGroup) -> Finding:
    index = finding.index
    if index is not None:
        index = (group.indices[index[0]],) + tuple(index[1:])
    return dataclasses.replace(finding, diagnosis=f"{_where(case, group)}: {finding.diagnosis}", index=index)


class _Judge:
    """One serving case's judgement: the budget of each sequence group, and the findings so far."""

    def __init__(self, kernel, case: ServingCase, contract, device, regime):
        self.kernel, self.case, self.device, self.regime = kernel, case, device, regime
        self.budgets = group_budgets(case, contract, device)

    def judge(self, run: FormRun) -> tuple[list[Finding], float]:
        findings, worst = [], 0.0
        for group, budget in zip(self.case.groups, self.budgets):
            out = self.case.unpack(run.out, group)
            lse = None if run.lse is None else self.case.unpack(run.lse, group, lse=True)
            found, ratio = compare(out, lse, budget, regime=self.regime, **promises(self.kernel.spec))
            findings += [_poison_noted(_in_batch(f, self.case, group), self.case) for f in found]
            worst = max(worst, ratio) if not math.isnan(ratio) else worst
        return findings, worst


def _poison_noted(finding: Finding, case: ServingCase) -> Finding:
    """A non-finite output where NaN fills the memory no sequence owns may be that NaN read: the finding says which
    promise it breaks then."""
    promise = _nan_promise(case)
    if finding.kind != "nonfinite" or promise is None:
        return finding
    note = f" (NaN fills the memory no sequence owns, and {promise_note(promise)})"
    return dataclasses.replace(finding, diagnosis=finding.diagnosis + note)


def group_budgets(case: ServingCase, contract, device) -> list:
    """The error budget of each sequence group's logical problem (:attr:`ServingCase.groups`), on ``device``; a
    quantizer's step over the packed batch done first."""
    groups = as_quantized(case, device).groups
    return [error_budget(*(t.to(device) for t in (g.case.q, g.case.k, g.case.v)), scale=case.scale,
                         causal=case.causal, precision=contract, variant=g.case.variant,
                         attn_mask=None if g.case.attn_mask is None else g.case.attn_mask.to(device))
            for g in groups]


def _crash(run: FormRun, regime, what: str | None = None) -> Finding:
    return Finding("crash", BUG, one_line(run.error, what), regime=regime, details={"traceback": run.traceback})


def check_serving(kernel, case: ServingCase, *, contract, device, properties=SERVING_PROPERTIES,
                  regime: str | None = None, meta: dict) -> Verdict:
    """Run ``kernel`` on ``case`` and judge every sequence's output (at each split count of a split-KV kernel),
    then the properties asked for."""
    if case.k_slack is not None and not kernel.spec.seqused_k:
        raise InvalidArgument("case", case.describe(), f"passes seqused_k, which {kernel.name} does not declare",
                              "Declare seqused_k=True in the kernel's spec, or use a case without k_slack.")
    splits = settings(kernel.spec)
    run = run_form(kernel, case, device, setting=splits[0])
    if run.error is not None:
        return Verdict.from_findings([_crash(run, regime)], max_ratio=math.nan, elapsed={"kernel": run.seconds},
                                     **meta)
    elapsed = {"kernel": run.seconds}
    written = inputs_written(case.physical(device).tensors, run.tensors, regime)
    wrong = _shape_problems(run, case)
    if wrong:
        return Verdict.from_findings(written + wrong, max_ratio=math.nan, elapsed=elapsed, **meta)
    start = time.perf_counter()
    judge = _Judge(kernel, case, contract, device, regime)
    findings, worst = judge.judge(run)
    findings = written + findings
    if len(splits) > 1:  # every split count names itself, the first too
        findings = _at_splits(findings, splits[0])
    for n in splits[1:]:
        found, ratio = _other_splits(judge, run, n, splits[0])
        findings, worst = findings + found, max(worst, ratio)
    elapsed["oracle"] = time.perf_counter() - start
    start, checked = time.perf_counter(), []
    for name in SERVING_PROPERTIES:
        if name in properties and not any(f.kind == "crash" for f in findings):
            ran = _PROPERTIES[name](judge, run, findings, splits[0])
            checked += [name] if ran else []
    elapsed["properties"] = time.perf_counter() - start
    verdict = Verdict.from_findings(findings, max_ratio=worst if case.groups else math.nan, elapsed=elapsed,
                                    properties=checked, **meta)
    verdict.output = (run.out, run.lse)
    return verdict


def _other_splits(judge: _Judge, first: FormRun, n: Setting, first_at: Setting) -> tuple[list[Finding], float]:
    """The findings of the kernel at ``n`` splits: its own against the budget, and (where the spec promises split
    invariance) bits other than those at the first split count, ``first_at``."""
    spec, what = judge.kernel.spec, n.label()
    run = run_form(judge.kernel, judge.case, judge.device, setting=n, what=f"the kernel at {what}")
    if run.error is not None:
        return [_crash(run, judge.regime, what)], 0.0
    wrong = _shape_problems(run, judge.case)
    if wrong:
        return wrong, 0.0
    found, ratio = judge.judge(run)
    found = _at_splits(found, n)
    if spec.split_invariant:
        changed = _bits_changed(judge.case, first, run, lambda b: True)
        if changed is not None:
            found.append(Finding("split_dependence", BUG, f"{what}: against {first_at.label()}: "
                                 f"{changed} (the spec promises split invariance)", regime=judge.regime))
    return found, ratio


def _at_splits(findings: list[Finding], n: Setting) -> list[Finding]:
    """``findings`` of the kernel at ``n`` splits, their diagnosis led by the split count's label."""
    return [dataclasses.replace(f, diagnosis=f"{n.label()}: {f.diagnosis}") for f in findings]


def _bits_changed(case: ServingCase, base: FormRun, rerun: FormRun, keep) -> str | None:
    """Where ``rerun`` differs in bits from ``base`` on the sequences ``keep`` (a predicate), or None."""
    if rerun.error is not None:
        return _raised(rerun)
    for group in case.groups:
        chosen = [i for i, b in enumerate(group.indices) if keep(b)]
        if not chosen:
            continue
        for tensor in ("out", "lse"):
            a, b = getattr(base, tensor), getattr(rerun, tensor)
            if a is None:
                continue
            if not isinstance(b, torch.Tensor) or b.shape != a.shape:
                return f"its {tensor} has another shape"
            diff = differs(case.unpack(a, group, lse=tensor == "lse")[chosen],
                           case.unpack(b, group, lse=tensor == "lse")[chosen])
            if bool(diff.any()):
                return f"{int(diff.sum())} elements of the {tensor} of {_where(case, group)} changed"
    return None


def _raised(run: FormRun) -> str:
    return f"it raised {type(run.error).__name__}: {run.error}".splitlines()[0][:300]


_RERUN = "a property's rerun of the kernel"


def _nan_promise(case: ServingCase) -> str | None:
    """The promise a case poisoned with NaN holds the kernel to (strategies draw it only for kernels that make it)."""
    return "nan_safe_masking" if case.poison == "nan" else None


def _property(kind: str, what: str, findings: list, regime, changed: str | None, promise: str | None = None) -> bool:
    """Record a ``kind`` finding where ``changed`` says what changed; ``promise``: the spec field it breaks."""
    if changed is not None:
        note = f" ({promise_note(promise)})" if promise else ""
        findings.append(Finding(kind, BUG, f"{what}: {changed}{note}", regime=regime))
    return True


def _determinism(judge: _Judge, run, findings, splits) -> bool:
    kernel, case, device, regime = judge.kernel, judge.case, judge.device, judge.regime
    if not kernel.spec.deterministic:
        return False
    again = run_form(kernel, case, device, setting=splits, what=_RERUN)
    return _property("nondeterminism", "a second identical call", findings, regime,
                     _bits_changed(case, run, again, lambda b: True), promise="deterministic")


def _isolation(judge: _Judge, run, findings, splits) -> bool:
    """Poison the keys and values of every other sequence: the rest must keep their bits. For a kernel whose
    quantizer reads every packed key (k's mean over the batch) poisoned keys legitimately move every sequence's
    codes: only the values are poisoned then, which its quantizer does not read, and the bits must still hold."""
    kernel, case, device = judge.kernel, judge.case, judge.device
    if len(case.q_lens) < 2:
        return False
    keys = not reads_every_key(kernel.spec.quantization)
    for parity in (0, 1):
        which = torch.tensor([b % 2 != parity for b in range(len(case.q_lens))])
        rerun = run_form(kernel, case.with_sequences_poisoned(which, keys=keys), device, setting=splits, what=_RERUN)
        changed = _bits_changed(case, run, rerun, lambda b, p=parity: b % 2 == p)
        if changed is not None:
            return _property("poison_leak", f"{case.poison} poison in the {'keys and ' if keys else ''}values of the "
                             f"{'odd' if parity == 0 else 'even'} sequences", findings, judge.regime, changed,
                             promise=_nan_promise(case))
    return True


def _page_order(judge: _Judge, run, findings, splits) -> bool:
    kernel, case, device, regime = judge.kernel, judge.case, judge.device, judge.regime
    relayout = form(case.form).relayout
    if relayout is None:
        return False
    rerun = run_form(kernel, relayout(case), device, setting=splits, what=_RERUN)
    return _property("layout_dependence", "the page pool in another order (the block table renumbered)", findings,
                     regime, _bits_changed(case, run, rerun, lambda b: True))


def _batch(judge: _Judge, run, findings, splits) -> bool:
    kernel, case, device, regime = judge.kernel, judge.case, judge.device, judge.regime
    if not kernel.spec.batch_invariant or len(case.q_lens) < 2:
        return False
    last = len(case.q_lens) - 1
    alone = case.only(last)
    rerun = run_form(kernel, alone, device, setting=splits, what=_RERUN)
    if rerun.error is not None or not case.q_lens[last]:
        return True
    group = SequenceGroup((last,), None)
    mine = case.unpack(run.out, group)
    diff = differs(mine, alone.unpack(rerun.out, SequenceGroup((0,), None)))
    if diff is None or bool(diff.any()):
        findings.append(Finding("batch_dependence", BUG, f"the last of {last + 1} sequences run alone differs "
                                "(the spec promises batch invariance)", regime=regime))
    return True


_PROPERTIES = {"determinism": _determinism, "isolation": _isolation, "page_order": _page_order, "batch": _batch}
