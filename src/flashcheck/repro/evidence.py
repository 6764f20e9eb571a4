"""What a reproducer is built from: flashcheck's own replay of the case (its verdict, the kernel's output and the
diagnosis) and flashcheck's error model's budget for every element the script compares, computed by the functions
that judge the case (:func:`~flashcheck.numerics.budget.error_budget`,
:func:`~flashcheck.numerics.gradient_budget.gradient_budget`, :func:`~flashcheck.judge.check.check`,
:func:`~flashcheck.judge.backward.check_backward`): the script carries these numbers as data and sets none. A
serving case's budgets are its sequence groups', placed in the form's output layout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..contract.precision import precision_named
from ..contract.spec import Kernel
from ..inputs.serving import ServingCase
from ..judge.backward import check_backward, is_backward_case, upstream_gradient
from ..judge.check import check
from ..judge.serving import group_budgets
from ..judge.verdict import BUG, Verdict
from ..numerics.budget import error_budget
from ..numerics.gradient_budget import gradient_budget

__all__ = ["Compared", "Evidence", "gather", "CHECKED_KINDS"]

# The findings the script checks (the output against the budget, the promises, a crash); the others are
# properties of reruns (poison, layouts, determinism, ...) that it does not make.
CHECKED_KINDS = ("over_budget", "nonfinite", "masked_row_promise", "lse", "crash", "wrong_output")


@dataclass
class Compared:
    """One tensor the script judges: what the kernel gave in flashcheck's replay (None after a crash), the
    oracle's exact value and the budget, float64, and the rows left to a promise (``empty``) or None."""

    got: torch.Tensor | None
    exact: torch.Tensor
    budget: torch.Tensor
    empty: torch.Tensor | None = None


@dataclass
class Evidence:
    verdict: Verdict
    backward: bool
    tensors: dict  # name -> Compared: out (and lse), or dq, dk, dv
    do: torch.Tensor | None = None
    promises: dict = field(default_factory=dict)  # rows with no visible key: {"out": ..., "lse": ...}
    lse_base: str = "e"
    precision: str = "flash"  # the name of the precision contract the budgets hold the kernel to

    @property
    def finding(self):
        """The finding the report is about: the first BUG, else the first at all (None for a PASS)."""
        return next((f for f in self.verdict.findings if f.status == BUG), None) or next(iter(self.verdict.findings),
                                                                                        None)

    @property
    def diagnosis(self) -> str:
        f = self.finding
        if f is None:
            return f"{self.verdict.status} (no finding)" + (f"; skipped: {self.verdict.skipped}"
                                                           if self.verdict.skipped else "")
        return f"{f.status} {f.kind}: {f.diagnosis}".splitlines()[0]

    @property
    def unchecked(self) -> list[str]:
        """The kinds of the verdict's findings that the script does not check."""
        return sorted({f.kind for f in self.verdict.findings if f.kind not in CHECKED_KINDS})


def gather(kernel: Kernel, case, *, device: str) -> Evidence:
    """Replay ``case`` on ``kernel`` as ``flashcheck replay`` does, with the budgets the script will carry."""
    if isinstance(case, ServingCase):
        return _gather_serving(kernel, case, device=device)
    device = torch.device(device)
    exact = tuple(t.to(device) for t in (case.q, case.k, case.v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    kw = dict(scale=case.scale, causal=case.causal, attn_mask=mask, precision=kernel.spec.precision,
              variant=case.variant)
    spec = kernel.spec
    if is_backward_case(case):  # its provenance names the dO regime and seed it failed with
        do = upstream_gradient(case, device)
        budget = gradient_budget(*exact, do, **kw)
        verdict = check_backward(kernel, case, device=device, do=do)
        grads = verdict.output if isinstance(verdict.output, tuple) else (None, None, None)
        tensors = {n: Compared(g, budget.gradients[n], budget.total[n]) for n, g in zip(("dq", "dk", "dv"), grads)}
        return Evidence(verdict, True, tensors, do=do, precision=precision_named(spec.precision).name)
    budget = error_budget(*exact, **kw)
    verdict = check(kernel, case, device=device, budget=budget)  # the same budget judges the replay
    ref = budget.reference
    return _forward(verdict, spec, Compared(None, ref.out, budget.total, ref.empty_rows),
                    Compared(None, ref.lse, budget.lse_total, ref.empty_rows))


def _forward(verdict: Verdict, spec, out: Compared, lse: Compared) -> Evidence:
    """The evidence of a forward replay: what the kernel gave joins the exact values and budgets ``out`` and
    ``lse`` (the lse's budget is carried even without an lse here, a crash: the script judges one it gets)."""
    got_out, got_lse = verdict.output if isinstance(verdict.output, tuple) else (None, None)
    base = math.log(2) if spec.lse_base == "2" else 1.0
    out.got, lse.got = got_out, None if got_lse is None else got_lse.detach().double() * base
    empty_lse = spec.empty_lse or ("-inf" if spec.fully_masked_rows == "zero" else "any")
    return Evidence(verdict, False, {"out": out, "lse": lse},
                    promises={"out": spec.fully_masked_rows, "lse": empty_lse}, lse_base=spec.lse_base,
                    precision=precision_named(spec.precision).name)


def _gather_serving(kernel: Kernel, case: ServingCase, *, device: str) -> Evidence:
    """A serving case replayed (at its first split count for the outputs), each group's exact values and budgets
    placed in the form's output layout."""
    verdict = check(kernel, case, device=device)
    budgets = group_budgets(case, kernel.spec.precision, torch.device(device))
    refs = [b.reference for b in budgets]
    empty = [r.empty_rows.cpu() for r in refs]
    out = Compared(None, case.pack([r.out.cpu() for r in refs]), case.pack([b.total.cpu() for b in budgets],
                                                                           fill=math.nan),
                   case.pack([e[..., None] for e in empty], fill=True)[..., 0])
    lse = Compared(None, case.pack([r.lse.cpu() for r in refs], lse=True),
                   case.pack([b.lse_total.cpu() for b in budgets], lse=True, fill=math.nan),
                   case.pack(empty, lse=True, fill=True))
    return _forward(verdict, kernel.spec, out, lse)
