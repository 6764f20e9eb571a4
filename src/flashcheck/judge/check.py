"""Checking one kernel on one case: run it, compare every element with the oracle, give a verdict.

``check`` runs a kernel on an :class:`~flashcheck.inputs.case.AttentionCase` and returns a
:class:`~flashcheck.judge.verdict.Verdict`; ``assert_attention_close`` does the same for an output the caller
computed. Numbers come from :mod:`flashcheck.numerics.budget`; nothing here sets a tolerance.
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from ..contract.precision import Precision, precision_named
from ..contract.spec import Kernel, as_kernel
from ..errors import InvalidArgument, Unsupported
from ..inputs.case import AttentionCase
from ..kernels.registry import resolve_kernel
from ..numerics.budget import Budget, error_budget
from ..numerics.oracle import Reference
from ..numerics.twin import twin_attention
from .diagnose import diagnose_elements, which_keys
from .properties import PROPERTIES, check_properties
from .verdict import BUG, SUSPICIOUS, Finding, Verdict

__all__ = ["KernelRun", "run_kernel", "check", "compare", "assert_attention_close"]


@dataclass
class KernelRun:
    """What one call of a kernel produced: an output (and lse), or the exception it raised."""

    out: torch.Tensor | None
    lse: torch.Tensor | None
    error: BaseException | None
    traceback: str | None
    seconds: float


def run_kernel(kernel, q, k, v, *, scale, causal, attn_mask=None) -> KernelRun:
    """Call a kernel, catching what it raises; never lets a kernel's exception escape."""
    start = time.perf_counter()
    try:
        result = kernel(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
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


def error_ratios(got: torch.Tensor, exact: torch.Tensor, total: torch.Tensor, empty: torch.Tensor):
    """(err / budget, err) per element: 0 on rows with no visible key, on non-finite outputs (other
    findings) and on exact answers, even where the budget is 0."""
    live = ~empty[..., None] & torch.isfinite(got)
    err = (got - exact).abs()
    ratio = torch.where(live, err / total, torch.zeros_like(err))
    return torch.where(err == 0, torch.zeros_like(ratio), ratio), err


def _on_host(*values, device) -> list:
    """Device scalars (0-d tensors, or Python numbers) as Python floats, in one transfer."""
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]).tolist()


def compare(out: torch.Tensor, lse: torch.Tensor | None, budget: Budget, *,
            fully_masked_rows: str = "any", regime: str | None = None) -> tuple[list[Finding], float]:
    """Findings of an output against the oracle and its budget, and the largest error/budget ratio."""
    ref = budget.reference
    shapes = ref.shapes
    rows = ref.rows
    if rows is not None:
        out = out.index_select(2, rows.to(out.device))
        lse = lse.index_select(2, rows.to(lse.device)) if lse is not None else None
    got = out.detach().to(ref.out.device, torch.float64)
    empty = ref.empty_rows
    live = ~empty[..., None].expand_as(got)
    findings: list[Finding] = []

    nonfinite = live & ~torch.isfinite(got)
    ratio, err = error_ratios(got, ref.out, budget.total, empty)
    over = ratio > 1
    bad_lse = None
    if lse is not None:
        got_lse = lse.detach().to(ref.out.device, torch.float64)
        lse_err = (got_lse - ref.lse).abs()
        bad_lse = ~empty & ~(lse_err <= budget.lse_total)  # NaN counts as bad
    # One transfer for every decision below: each separate read would wait for the device.
    any_nonfinite, any_over, any_empty, any_bad_lse, max_ratio = _on_host(
        nonfinite.any(), over.any(), empty.any(), False if bad_lse is None else bad_lse.any(),
        ratio.max() if ratio.numel() else math.nan, device=got.device)
    if any_nonfinite:
        idx = tuple(int(i) for i in torch.nonzero(nonfinite)[0])
        findings.append(Finding(
            "nonfinite", BUG,
            f"{got[idx]} where the oracle is finite: " + diagnose_elements(nonfinite, shapes, rows, empty),
            index=idx, regime=regime))

    if any_over:
        idx = tuple(int(i) for i in torch.nonzero(ratio == max_ratio)[0])
        diagnosis = diagnose_elements(over, shapes, rows, empty)
        keys = None if ref.inputs is None else which_keys(got[idx[:3]], ref.inputs, idx, budget.total[idx[:3]],
                                                          row=None if rows is None else int(rows[idx[2]]))
        diagnosis += f"; {keys}" if keys else ""
        findings.append(Finding(
            "over_budget", BUG, diagnosis,
            index=idx, error=float(err[idx]), budget=budget.breakdown(idx), ratio=float(ratio[idx]),
            regime=regime, details={"elements_over": int(over.sum()), "keys": keys}))

    if any_empty and fully_masked_rows != "any":
        rows_out = got[empty]
        if fully_masked_rows == "zero":
            broken = ~(rows_out == 0).all(-1)
            if lse is not None:
                lse_rows = lse.detach().to(ref.out.device, torch.float64)[empty]
                broken |= ~(lse_rows == -math.inf)
        else:  # "nan"
            broken = ~torch.isnan(rows_out).all(-1)
        if bool(broken.any()):
            example = rows_out[broken][0][:4].tolist()
            findings.append(Finding(
                "masked_row_promise", BUG,
                f"{int(broken.sum())} of {int(empty.sum())} rows with no visible key are not "
                f"{fully_masked_rows!r} (first values {example})", regime=regime))

    if any_bad_lse:
        live_rows = ~empty
        lse_ratio = torch.where(live_rows, lse_err / budget.lse_total, torch.zeros_like(lse_err))
        idx = tuple(int(i) for i in torch.nonzero(bad_lse)[0])
        findings.append(Finding(
            "lse", BUG, f"lse off on {int(bad_lse.sum())} of {int(live_rows.sum())} rows "
            f"(got {float(got_lse[idx]):.6g}, exact {float(ref.lse[idx]):.6g})",
            index=idx, error=float(lse_err[idx]), ratio=float(torch.nan_to_num(lse_ratio, nan=math.inf, posinf=math.inf)[idx]),
            budget={"total": float(budget.lse_total[idx])}, regime=regime))
    return findings, max_ratio


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
    if not isinstance(case, AttentionCase):
        raise InvalidArgument("case", case, "expected a flashcheck AttentionCase",
                              "Build one with AttentionCase.create(q, k, v, scale=...) or load a saved one.")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    # A name ("torch:math", "flashcheck:triton[block_m=32]", "pkg.mod:fn") resolves as on the command line.
    kern: Kernel = resolve_kernel(kernel, device=device.type) if isinstance(kernel, str) else as_kernel(kernel)
    contract = precision_named(precision) if precision is not None else kern.spec.precision
    regime = case.provenance.get("strategy") if case.provenance else None
    meta = dict(kernel=kern.name, case=case.describe(), regime=regime)
    compiled_before = _compilation_stats()
    try:
        verdict = _check(kern, case, contract, device, reference, budget, properties, envelope, regime, meta)
    except _Skip as skip:
        verdict = _skipped(skip, device, meta)
    except torch.cuda.OutOfMemoryError as exc:  # flashcheck's own tensors: the inputs, the float64 oracle
        verdict = _skipped(_Skip("oom", _one_line("flashcheck's inputs or oracle", exc)), device, meta)
    return _count_compilations(verdict, compiled_before)


def _compilation_stats() -> tuple[int, float] | None:
    # Only a process that imported triton can have compiled a Triton kernel: never import it here.
    if "triton" not in sys.modules:
        return None
    from ..kernels.triton.cache import compilation_stats

    return compilation_stats()


def _count_compilations(verdict: Verdict, before: tuple[int, float] | None) -> Verdict:
    """Record the Triton compilations of the case's kernel calls (first run and property reruns)."""
    after = _compilation_stats()
    if after is not None:
        count, seconds = before or (0, 0.0)
        verdict.compilations = after[0] - count
        verdict.elapsed["compile"] = after[1] - seconds
    return verdict


def _one_line(where: str, error: BaseException) -> str:
    return f"{where}: {type(error).__name__}: {error}".splitlines()[0][:300]


class _Skip(Exception):
    """A run of the kernel (the first or a property's rerun) cannot be judged: ``kind`` is ``"oom"``
    (out of device memory) or ``"unsupported"`` (the kernel raised :class:`Unsupported`)."""

    def __init__(self, kind: str, reason: str):
        super().__init__(f"{kind}: {reason}")
        self.kind = kind


def _skipped(skip: _Skip, device, meta: dict) -> Verdict:
    # Neither too big for this device nor outside what the kernel does is a defect: skip the case and
    # say why ("<kind>: <reason>", which campaigns count per kind).
    if skip.kind == "oom" and device.type == "cuda":
        torch.cuda.empty_cache()  # so that the next case starts clean
    return Verdict.from_findings([], max_ratio=math.nan, skipped=str(skip), **meta)


def _run_or_skip(kern, q, k, v, *, scale, causal, attn_mask, what: str) -> KernelRun:
    run = run_kernel(kern, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    if isinstance(run.error, torch.cuda.OutOfMemoryError):
        raise _Skip("oom", _one_line(what, run.error))
    if isinstance(run.error, Unsupported):
        raise _Skip("unsupported", run.error.reason)
    return run


def _check(kern: Kernel, case: AttentionCase, contract, device, reference, budget, properties, envelope, regime,
           meta) -> Verdict:
    q, k, v, mask = case.to_device(device)
    run = _run_or_skip(kern, q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask, what="the kernel")
    if run.error is not None:
        crash = Finding("crash", BUG, f"{type(run.error).__name__}: {run.error}".splitlines()[0][:300],
                        regime=regime, details={"traceback": run.traceback})
        return Verdict.from_findings([crash], max_ratio=math.nan, elapsed={"kernel": run.seconds}, **meta)
    t0 = time.perf_counter()
    if budget is None:
        ref_inputs = (case.q.to(device), case.k.to(device), case.v.to(device))
        kw = dict(scale=case.scale, causal=case.causal, attn_mask=None if mask is None else mask)
        # Without a reference, the oracle and the budget share one walk over the scores.
        budget = error_budget(*ref_inputs, **kw, precision=contract, reference=reference)
    t_oracle = time.perf_counter() - t0
    reference = budget.reference
    wrong = _output_problems(run.out, run.lse, reference.shapes, case.torch_dtype, q.device)
    if wrong:
        return Verdict.from_findings(wrong, max_ratio=math.nan,
                                     elapsed={"kernel": run.seconds, "oracle": t_oracle}, **meta)
    findings, max_ratio = compare(run.out, run.lse, budget, fully_masked_rows=kern.spec.fully_masked_rows,
                                  regime=regime)
    # A row already explained by a wrong set of keys needs no probe of the matmul.
    unexplained = [f for f in findings if f.kind in ("over_budget", "nonfinite") and not (f.details or {}).get("keys")]
    if unexplained:
        note = matmul_probe(kern, case.torch_dtype, q.device)
        if note:
            for f in unexplained:
                f.diagnosis += "; " + note
    elapsed = {"kernel": run.seconds, "oracle": t_oracle}
    notes: list[str] = []
    if properties:
        t0 = time.perf_counter()

        def rerun(q_, k_, v_, mask_):
            return _run_or_skip(kern, q_, k_, v_, scale=case.scale, causal=case.causal, attn_mask=mask_,
                                what="a property's rerun of the kernel")

        def judge(out, lse):
            wrong = _output_problems(out, lse, reference.shapes, case.torch_dtype, q.device)
            return wrong or compare(out, lse, budget, fully_masked_rows=kern.spec.fully_masked_rows, regime=regime)[0]

        findings += check_properties(rerun, case, run, device=device, properties=properties,
                                     deterministic=kern.spec.deterministic,
                                     nan_safe_masking=kern.spec.nan_safe_masking,
                                     fully_masked_rows=kern.spec.fully_masked_rows,
                                     batch_invariant=kern.spec.batch_invariant,
                                     layout_invariant=kern.spec.layout_invariant, judge=judge, notes=notes,
                                     regime=regime)
        elapsed["properties"] = time.perf_counter() - t0
    if envelope and not findings and max_ratio > ENVELOPE_FLOOR:
        t0 = time.perf_counter()
        findings += envelope_findings(case, budget, max_ratio, device=device, regime=regime, out=run.out)
        elapsed["envelope"] = time.perf_counter() - t0
    checked = [p for p in properties if p != "batch" or case.shapes.batch > 1]
    verdict = Verdict.from_findings(findings, max_ratio=max_ratio, elapsed=elapsed, notes=notes,
                                    properties=checked, **meta)
    verdict.output = (run.out, run.lse)
    return verdict


# An output inside the budget but this many times past the worst legal reordering is SUSPICIOUS.
ENVELOPE_FACTOR = 8.0
# Below this err/budget nothing is suspicious: the budget is loose there and the envelope is noise.
ENVELOPE_FLOOR = 0.05
# The twin's runs whose spread is the envelope: for a tiled contract, tile shapes and key orders
# (block_m, block_n, keys shuffled); for a one-pass contract, where tiles change nothing, the orders
# of operations a kernel may pick (scale on Q and K, softmax before P @ V, keys shuffled).
ENVELOPE_TILINGS = ((16, 16, False), (64, 64, False), (32, 128, True), (128, 32, True))
ENVELOPE_ONE_PASS = ((False, False, False), (True, True, False), (True, False, True), (False, True, True))


def _envelope_runs(precision, dtype: str):
    tf32_modes = ("nearest", "truncate") if precision.tf32 and dtype == "fp32" else ("nearest",)
    if precision.rescales_per_tile:
        runs = [dict(block_m=m, block_n=n, shuffled=shuffled) for m, n, shuffled in ENVELOPE_TILINGS]
    else:
        runs = [dict(scale_inputs=scaled and precision.scale_on_inputs, softmax_first=first, shuffled=shuffled)
                for scaled, first, shuffled in ENVELOPE_ONE_PASS]
    return [dict(run, tf32_mode=mode) for run in runs for mode in tf32_modes]


def reordering_envelope(case: AttentionCase, budget: Budget, *, device, enough: float = math.inf,
                        head: tuple[int, int] | None = None) -> float:
    """The largest err/budget of the precision-faithful twin over the legal orders of operations.

    It stops once it reaches ``enough`` (past that the verdict cannot change). ``head=(b, h)`` runs the
    twin on that head alone: its envelope is at most the whole case's, and costs a fraction of it.
    """
    q, k, v, mask, ref_parts = _envelope_inputs(case, budget, device, head)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for run in _envelope_runs(budget.precision, case.dtype):
        order = torch.randperm(case.shapes.n_k, generator=gen) if run.pop("shuffled") else None
        out, _ = twin_attention(q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask,
                                precision=budget.precision, key_order=order, **run)
        rows = budget.reference.rows
        out = out if rows is None else out.index_select(2, rows.to(out.device))
        ratio, _ = error_ratios(out.to(torch.float64), *ref_parts)
        worst = max(worst, float(ratio.max()) if ratio.numel() else 0.0)
        if worst >= enough:
            break
    return worst


def _envelope_inputs(case: AttentionCase, budget: Budget, device, head):
    """The twin's inputs and the oracle's (out, budget, empty rows) for the whole case or one head."""
    q, k, v = (t.to(device) for t in (case.q, case.k, case.v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    ref = budget.reference
    parts = (ref.out, budget.total, ref.empty_rows)
    if head is None:
        return q, k, v, mask, parts
    b, h = head
    kv = h // case.shapes.group
    if mask is not None:
        mask = torch.broadcast_to(mask, (*q.shape[:3], k.shape[2]))[b:b + 1, h:h + 1]
    one = (slice(b, b + 1), slice(h, h + 1))
    return (q[one], k[b:b + 1, kv:kv + 1], v[b:b + 1, kv:kv + 1], mask, tuple(t[one] for t in parts))


def envelope_findings(case: AttentionCase, budget: Budget, max_ratio: float, *, device,
                      regime: str | None = None, out: torch.Tensor | None = None) -> list[Finding]:
    """A SUSPICIOUS finding when the kernel sits far outside the twin's reordering envelope.

    With the kernel's ``out``, the twin first runs on the head of its worst element alone, and on the
    whole case only when that head's envelope leaves the verdict open.
    """
    enough = max_ratio / ENVELOPE_FACTOR
    envelope = 0.0
    if out is not None and budget.reference.shapes.batch * budget.reference.shapes.heads_q > 1:
        envelope = reordering_envelope(case, budget, device=device, enough=enough, head=_worst_head(out, budget))
    if envelope < enough:
        envelope = reordering_envelope(case, budget, device=device, enough=enough)
    if max_ratio <= ENVELOPE_FACTOR * max(envelope, 1e-300):
        return []
    return [Finding(
        "reordering_outlier", SUSPICIOUS,
        f"inside the hard budget (max error/budget {max_ratio:.3g}) but {max_ratio / max(envelope, 1e-300):.3g} "
        f"times the worst legal reordering of the twin ({envelope:.3g} over its orders of operations: tilings, "
        f"key orders, where the scale and the normalisation apply); a systematic error below the budget, or a kernel outside its precision contract",
        ratio=max_ratio, regime=regime, details={"envelope": envelope, "factor": ENVELOPE_FACTOR})]


def _worst_head(out: torch.Tensor, budget: Budget) -> tuple[int, int]:
    ref = budget.reference
    got = out if ref.rows is None else out.index_select(2, ref.rows.to(out.device))
    ratio, _ = error_ratios(got.detach().to(ref.out.device, torch.float64), ref.out, budget.total, ref.empty_rows)
    per_head = ratio.flatten(2).amax(-1)
    b, h = divmod(int(per_head.argmax()), per_head.shape[1])
    return b, h


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
                           lse: torch.Tensor | None = None, fully_masked_rows: str = "any") -> Verdict:
    """Assert that ``out`` (and ``lse``) is within the error budget of ``precision`` for ``reference``.

    ``reference`` comes from :func:`flashcheck.reference_attention` on the same inputs. Raises an
    ``AssertionError`` that carries the verdict's explanation; returns the verdict otherwise.
    """
    if not isinstance(reference, Reference) or reference.inputs is None:
        raise InvalidArgument("reference", reference, "expected the result of flashcheck.reference_attention",
                              "Pass reference_attention(q, k, v, scale=..., ...) computed on the kernel's inputs.")
    inputs = reference.inputs
    budget = error_budget(inputs["q"], inputs["k"], inputs["v"], scale=inputs["scale"], causal=inputs["causal"],
                          attn_mask=inputs["attn_mask"], precision=precision, reference=reference)
    wrong = _output_problems(out, lse, reference.shapes, inputs["q"].dtype, inputs["q"].device)
    if wrong:
        verdict = Verdict.from_findings(wrong, max_ratio=math.nan)
    else:
        findings, max_ratio = compare(out, lse, budget, fully_masked_rows=fully_masked_rows)
        verdict = Verdict.from_findings(findings, max_ratio=max_ratio)
    if not verdict.ok:
        raise AssertionError(str(verdict))
    return verdict
