"""What a reproducer is built from: flashcheck's own replay of the case (its verdict, the kernel's output and the
diagnosis) and flashcheck's error model's budget for every element the script compares, computed by the functions
that judge the case (:func:`~flashcheck.numerics.budget.error_budget`,
:func:`~flashcheck.numerics.gradient_budget.gradient_budget`, :func:`~flashcheck.judge.check.check`,
:func:`~flashcheck.judge.backward.check_backward`): the script carries these numbers as data and sets none."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..contract.precision import precision_named
from ..contract.spec import Kernel
from ..judge.backward import check_backward, is_backward_case, upstream_gradient
from ..judge.check import check
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
    out, lse = verdict.output if isinstance(verdict.output, tuple) else (None, None)
    ref = budget.reference
    tensors = {"out": Compared(out, ref.out, budget.total, ref.empty_rows)}
    # The lse's budget is carried even without an lse here (a crash): the script judges one where it gets one.
    base = math.log(2) if spec.lse_base == "2" else 1.0
    tensors["lse"] = Compared(None if lse is None else lse.detach().double() * base, ref.lse, budget.lse_total,
                              ref.empty_rows)
    empty_lse = spec.empty_lse or ("-inf" if spec.fully_masked_rows == "zero" else "any")
    return Evidence(verdict, False, tensors, promises={"out": spec.fully_masked_rows, "lse": empty_lse},
                    lse_base=spec.lse_base, precision=precision_named(spec.precision).name)
