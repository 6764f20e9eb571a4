"""Checking one kernel on one case: run it, compare every element with the oracle, give a verdict.

``check`` runs a kernel on an :class:`~flashcheck.inputs.case.AttentionCase` and returns a
:class:`~flashcheck.judge.verdict.Verdict`; ``assert_attention_close`` does the same for an output the caller
computed. An output is compared with the oracle in :mod:`~flashcheck.judge.comparison`, with the
reordering envelope in :mod:`~flashcheck.judge.envelope`, and rerun for the exact properties in
:mod:`~flashcheck.judge.properties`. Numbers come from :mod:`flashcheck.numerics.budget`; nothing here
sets a tolerance.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..contract.formats import SCALE_PROPERTY, output_format
from ..contract.precision import Precision, precision_named
from ..contract.spec import Kernel, as_kernel
from ..errors import InvalidArgument
from ..features.variant import check_variant
from ..inputs.case import AttentionCase, describe_inputs
from ..inputs.serving import ServingCase
from ..inputs.serving_inside import with_scheme
from ..kernels.registry import resolve_kernel
from ..kernels.triton.cache import compilation_stats
from ..numerics.budget import Budget, error_budget
from ..numerics.oracle import Reference
from .comparison import compare, inputs_written, promises
from .envelope import ENVELOPE_FLOOR, envelope_findings
from .phases import kernel_call
from .properties import PROPERTIES, check_properties, neutral_cases, reordered_cases, rescaled_case
from .serving import SERVING_PROPERTIES, check_serving
from .skips import Skip, one_line, out_of_memory, raise_skip, skipped_verdict
from .verdict import BUG, Finding, Verdict

__all__ = ["KernelRun", "run_kernel", "check", "assert_attention_close"]


@dataclass
class KernelRun:
    """What one call of a kernel produced: an output (and lse), or the exception it raised."""

    out: torch.Tensor | None
    lse: torch.Tensor | None
    error: BaseException | None
    traceback: str | None
    seconds: float


def run_kernel(kernel, q, k, v, *, scale, causal, attn_mask=None, **variant) -> KernelRun:
    """Call a kernel, catching what it raises; never lets a kernel's exception escape. ``variant``: the
    keywords of the case's variant (:meth:`~flashcheck.features.variant.Variant.kwargs`), passed on."""
    start = time.perf_counter()
    try:
        with kernel_call():  # the kernel's time, its launch's end included: a death here is the kernel's
            result = kernel(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, **variant)
            if q.is_cuda:
                torch.cuda.synchronize(q.device)
    except Exception as exc:  # a crash is a finding, not flashcheck's failure
        return KernelRun(None, None, exc, traceback.format_exc(), time.perf_counter() - start)
    out, lse = (result if isinstance(result, (tuple, list)) and len(result) == 2 else (result, None))
    return KernelRun(out, lse, None, None, time.perf_counter() - start)


def _output_problems(out, lse, shapes, dtype, device) -> list[Finding]:
    want_shape = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim_v)
    problems = []
    if not isinstance(out, torch.Tensor):
        problems.append(f"returned {type(out).__name__}, not a tensor")
    else:
        if tuple(out.shape) != want_shape:
            problems.append(f"out has shape {tuple(out.shape)}, expected {want_shape}")
        if out.dtype != dtype:
            problems.append(f"out has dtype {out.dtype}, expected {dtype}")
        if out.device != device:
            problems.append(f"out is on {out.device}, expected {device}")
    if lse is not None:
        if not isinstance(lse, torch.Tensor) or tuple(lse.shape) != want_shape[:-1]:
            problems.append(f"lse has shape {tuple(getattr(lse, 'shape', ()))}, expected {want_shape[:-1]}")
    return [Finding("wrong_output", BUG, p) for p in problems]


def check(kernel, case: AttentionCase, *, precision: Precision | str | None = None,
          device: str | torch.device | None = None, reference: Reference | None = None,
          budget: Budget | None = None, properties=PROPERTIES, envelope: bool = True) -> Verdict:
    """Run ``kernel`` on ``case`` and judge its output element by element.

    ``kernel`` is a kernel, a callable or a kernel name as the command line takes it. ``precision``
    overrides the kernel spec's contract; ``device`` defaults to CUDA when available.
    ``properties`` names the exact properties to check (each reruns the kernel; ``()`` for none);
    ``envelope`` compares an output inside the budget with the precision-faithful twin's reordering
    envelope and calls it SUSPICIOUS when it sits far outside.
    """
    if not isinstance(case, (AttentionCase, ServingCase)):
        raise InvalidArgument("case", case, "expected a flashcheck AttentionCase (or ServingCase)",
                              "Build one with AttentionCase.create(q, k, v, scale=...) or load a saved one.")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    # A name ("torch:math", "flashcheck:triton[block_m=32]", "pkg.mod:fn") resolves as on the command line.
    kern: Kernel = resolve_kernel(kernel, device=device.type) if isinstance(kernel, str) else as_kernel(kernel)
    contract = precision_named(precision) if precision is not None else kern.spec.precision
    _check_form(kern, case)
    if kern.spec.quantization.quantizer:  # the oracle attends its values
        case = (with_scheme(case, kern.spec.quantization) if isinstance(case, ServingCase) else
                dataclasses.replace(case, variant=case.variant.replace(quantization=kern.spec.quantization)))
    check_variant(case.variant, kern.spec, shapes=case.shapes, dtype=case.torch_dtype)
    regime = case.provenance.get("strategy") if case.provenance else None
    meta = dict(kernel=kern.name, case=case.describe(), regime=regime)
    compiled_before = compilations_so_far()
    try:
        if isinstance(case, ServingCase):
            serving = set(properties) and SERVING_PROPERTIES  # the dense properties' names ask for the forms' own
            verdict = check_serving(kern, case, contract=contract, device=device, properties=serving, regime=regime,
                                    meta=meta)
        else:
            verdict = _check(_Judgement(kernel=kern, case=case, contract=contract, device=device,
                                        reference=reference, budget=budget, properties=properties,
                                        envelope=envelope, regime=regime, meta=meta))
    except Skip as skip:
        verdict = skipped_verdict(skip, device, meta)
    except RuntimeError as exc:  # out of memory in flashcheck's own work: the inputs, the float64 oracle
        if not out_of_memory(exc):
            raise
        verdict = skipped_verdict(Skip("oom", one_line(exc, "flashcheck's inputs or oracle")), device, meta)
    return record_compilations(verdict, compiled_before)


def _check_form(kern: Kernel, case) -> None:
    form = case.form if isinstance(case, ServingCase) else "dense"
    if kern.spec.form != form:
        raise InvalidArgument("case", case.describe(), f"a {form} case, but {kern.name} declares form="
                              f"{kern.spec.form!r}", f"Draw {kern.spec.form} cases for it (flashcheck's strategies do, "
                              "from its spec), or declare the form the kernel takes.")


def compilations_so_far() -> tuple[int, float] | None:
    # Only a process that imported triton can have compiled a Triton kernel: never import it here.
    if "triton" not in sys.modules:
        return None
    return compilation_stats()


def record_compilations(verdict: Verdict, before: tuple[int, float] | None) -> Verdict:
    """Record the Triton compilations of the case's kernel calls (first run and reruns) since ``before``, the
    :func:`compilations_so_far` when the case began."""
    after = compilations_so_far()
    if after is not None:
        count, seconds = before or (0, 0.0)
        verdict.compilations = after[0] - count
        verdict.elapsed["compile"] = after[1] - seconds
    return verdict


def _run_or_skip(kern, q, k, v, *, scale, causal, attn_mask, what: str, variant: dict) -> KernelRun:
    run = run_kernel(kern, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, **variant)
    raise_skip(run.error, what)
    return run


@dataclass(frozen=True)
class _Judgement:
    """What judging one kernel on one case needs: ``check``'s arguments, resolved."""

    kernel: Kernel
    case: AttentionCase
    contract: Precision  # the precision contract the budget holds the kernel to
    device: torch.device
    reference: Reference | None  # the oracle, when the caller has it already
    budget: Budget | None  # the budget, likewise
    properties: tuple  # the properties to check
    envelope: bool  # whether to compare an output inside the budget with the reordering envelope
    regime: str | None  # the strategy that drew the case, for the findings
    meta: dict  # the verdict's kernel, case and regime

    def run(self, q, k, v, mask, *, what: str) -> KernelRun:
        return _run_or_skip(self.kernel, q, k, v, scale=self.case.scale, causal=self.case.causal, attn_mask=mask,
                            what=what, variant=self.case.variant.kwargs(q.device))

    def rerun(self, case: AttentionCase, q, k, v, mask) -> KernelRun:
        """The kernel on another case of the properties (its causal alignment and variant; this scale)."""
        return _run_or_skip(self.kernel, q, k, v, scale=self.case.scale, causal=case.causal, attn_mask=mask,
                            what="a property's rerun of the kernel", variant=case.variant.kwargs(q.device))

    def compare(self, out, lse, budget: Budget) -> tuple[list[Finding], float]:
        return compare(out, lse, budget, regime=self.regime, **promises(self.kernel.spec))


def _check(job: _Judgement) -> Verdict:
    case, elapsed = job.case, {}
    with _timed(elapsed, "transfer"):
        q, k, v, mask = case.to_device(job.device)
    run = job.run(q, k, v, mask, what="the kernel")
    if run.error is not None:
        return crash_verdict(run, job.regime, job.meta)
    elapsed["kernel"] = run.seconds
    written = inputs_written((case.q, case.k, case.v), (q, k, v), job.regime)
    with _timed(elapsed, "oracle"):
        budget = job.budget if job.budget is not None else _oracle_budget(job, mask)
    wrong = _output_problems(run.out, run.lse, budget.reference.shapes, output_format(q).dtype, q.device)
    if wrong:
        return Verdict.from_findings(written + wrong, max_ratio=math.nan, elapsed=elapsed, **job.meta)
    findings, max_ratio = job.compare(run.out, run.lse, budget)
    findings = written + findings
    _explain_outside_the_softmax(findings, job.kernel, case.torch_dtype, q.device)
    notes: list[str] = []
    if job.properties:
        with _timed(elapsed, "properties"):
            findings += _property_findings(job, run, budget, q.device, notes)
    # The twin models the 16- and 32-bit formats only: quantized inputs (a case's, or a kernel's own quantizer's)
    # have no reordering envelope.
    if job.envelope and not findings and max_ratio > ENVELOPE_FLOOR and not case.variant.quantized \
            and not case.variant.quantization.quantizer:
        with _timed(elapsed, "envelope"):
            findings += envelope_findings(case, budget, max_ratio, device=job.device, regime=job.regime, out=run.out)
    checked = [p for p in job.properties if _applies(p, case, job.kernel.spec)]
    verdict = Verdict.from_findings(findings, max_ratio=max_ratio, elapsed=elapsed, notes=notes,
                                    properties=checked, **job.meta)
    verdict.output = (run.out, run.lse)
    return verdict


def _applies(prop: str, case: AttentionCase, spec) -> bool:
    """Whether property ``prop`` judged anything on ``case`` (a batch of one has no other sequence)."""
    if prop == "batch":
        return case.shapes.batch > 1
    if prop == SCALE_PROPERTY:
        return rescaled_case(case) is not None
    if prop == "reorder":
        return bool(reordered_cases(case, spec))
    return prop != "neutral" or bool(neutral_cases(case, spec))


def crash_verdict(run, regime: str | None, meta: dict) -> Verdict:
    """The verdict on a kernel call (a :class:`KernelRun`, or a backward run) that raised."""
    crash = Finding("crash", BUG, one_line(run.error), regime=regime, details={"traceback": run.traceback})
    return Verdict.from_findings([crash], max_ratio=math.nan, elapsed={"kernel": run.seconds}, **meta)


@contextmanager
def _timed(elapsed: dict, what: str):
    start = time.perf_counter()
    yield
    elapsed[what] = time.perf_counter() - start


def _oracle_budget(job: _Judgement, mask) -> Budget:
    """The oracle and its budget, on the case's own (contiguous) tensors."""
    case, device = job.case, job.device
    # Without a reference, the oracle and the budget share one walk over the scores.
    return error_budget(case.q.to(device), case.k.to(device), case.v.to(device), scale=case.scale,
                        causal=case.causal, attn_mask=mask, precision=job.contract, reference=job.reference,
                        variant=case.variant)


def _explain_outside_the_softmax(findings: list[Finding], kern: Kernel, dtype: torch.dtype, device) -> None:
    """Add the matmul probe's note to the findings of bad elements that no wrong key set explains."""
    # A row already explained by a wrong set of keys needs no probe of the matmul.
    unexplained = [f for f in findings if f.kind in ("over_budget", "nonfinite") and not (f.details or {}).get("keys")]
    if unexplained:
        note = matmul_probe(kern, dtype, device)
        if note:
            for f in unexplained:
                f.diagnosis += "; " + note


def _property_findings(job: _Judgement, run: KernelRun, budget: Budget, device, notes: list) -> list[Finding]:
    """The properties' findings; a rerun's output is judged as the first run's was."""

    def judge(out, lse, case=None):
        """Findings of a rerun's output against the case's budget, or another ``case``'s own."""
        own = budget if case is None else error_budget(
            *(t.to(device) for t in (case.q, case.k, case.v)), scale=case.scale, causal=case.causal,
            attn_mask=None if case.attn_mask is None else case.attn_mask.to(device), precision=job.contract,
            variant=case.variant)
        wrong = _output_problems(out, lse, own.reference.shapes, output_format(job.case.q).dtype, device)
        return wrong or job.compare(out, lse, own)[0]

    return check_properties(job.rerun, job.case, run, device=job.device, spec=job.kernel.spec,
                            properties=job.properties, judge=judge, notes=notes, regime=job.regime)


def matmul_probe(kernel: Kernel, dtype: torch.dtype, device) -> str | None:
    """With one key the softmax weight is exactly 1, so out must equal v bit for bit.

    When it does not, the P @ V product itself is wrong: this is how the Triton interpreter's bf16
    tl.dot (which multiplies raw bit patterns) shows itself.
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 16, 32, generator=gen).to(dtype).to(device) for _ in range(3))
    k, v = k[:, :, :1], v[:, :, :1]
    run = run_kernel(kernel, q, k, v, scale=0.125, causal="none")
    if run.error is not None or not isinstance(run.out, torch.Tensor) or run.out.shape != (1, 1, 16, 32):
        return None
    want = v.expand_as(run.out)
    if torch.equal(run.out.to(dtype), want):
        return None
    rel = float(((run.out.double() - want.double()).abs() / want.double().abs().clamp_min(1e-30)).max())
    note = (f"with a single key (softmax weight exactly 1) out differs from v by up to {rel:.3g} relative: "
            "the defect lies outside the softmax (the P @ V matmul, the final normalisation or the store)")
    if os.environ.get("TRITON_INTERPRET") == "1" and dtype == torch.bfloat16:
        note += "; known cause: the Triton interpreter's tl.dot multiplies bf16 operands as raw bit patterns"
    return note


def assert_attention_close(out: torch.Tensor, reference: Reference, *, precision: Precision | str,
                           lse: torch.Tensor | None = None, fully_masked_rows: str = "any",
                           name: str = "the output") -> Verdict:
    """Assert that ``out`` (and ``lse``) is within the error budget of ``precision`` for ``reference``.

    ``reference`` comes from :func:`flashcheck.reference_attention` on the same inputs. Raises an
    ``AssertionError`` that carries the verdict's explanation, headed by ``name`` (what computed ``out``)
    and the inputs; returns the verdict otherwise.
    """
    if not isinstance(reference, Reference) or reference.inputs is None:
        raise InvalidArgument("reference", reference, "expected the result of flashcheck.reference_attention",
                              "Pass reference_attention(q, k, v, scale=..., ...) computed on the kernel's inputs.")
    if not isinstance(name, str):
        raise InvalidArgument("name", name, "expected a string", "Pass name='my_attention', or leave it out.")
    inputs = reference.inputs
    budget = error_budget(inputs["q"], inputs["k"], inputs["v"], scale=inputs["scale"], causal=inputs["causal"],
                          attn_mask=inputs["attn_mask"], precision=precision, reference=reference,
                          variant=inputs.get("variant"))
    meta = dict(kernel=name, case=describe_inputs(**inputs))
    wrong = _output_problems(out, lse, reference.shapes, output_format(inputs["q"]).dtype, inputs["q"].device)
    if wrong:
        verdict = Verdict.from_findings(wrong, max_ratio=math.nan, **meta)
    else:
        findings, max_ratio = compare(out, lse, budget, fully_masked_rows=fully_masked_rows)
        verdict = Verdict.from_findings(findings, max_ratio=max_ratio, **meta)
    if not verdict.ok:
        raise AssertionError(str(verdict))
    return verdict
