"""One output against the oracle: the error/budget of every element, and a finding for each kind of defect.

:func:`compare` is what ``check``, ``assert_attention_close`` and the properties' reruns judge an output
with; the reordering envelope (:mod:`flashcheck.judge.envelope`) measures the twin with the same ratios.
Numbers come from :mod:`flashcheck.numerics.budget`; nothing here sets a tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..contract.formats import raw_bits
from ..numerics.budget import Budget
from ..numerics.oracle import Reference
from .diagnose import diagnose_elements, first_index, which_keys
from .verdict import BUG, Finding

__all__ = ["compare", "error_ratios", "inputs_written", "on_oracle_rows", "promises"]

LN2 = math.log(2)


def promises(spec) -> dict:
    """What ``compare`` holds an output to besides the budget, from a kernel spec: fully masked rows and the
    lse's convention."""
    return {"fully_masked_rows": spec.fully_masked_rows, "lse_base": spec.lse_base, "empty_lse": spec.empty_lse}


def error_ratios(got: torch.Tensor, exact: torch.Tensor, total: torch.Tensor, empty: torch.Tensor):
    """(err / budget, err) per element: 0 on rows with no visible key, on non-finite outputs (other
    findings) and on exact answers, even where the budget is 0."""
    live = ~empty[..., None] & torch.isfinite(got)
    err = (got - exact).abs()
    ratio = torch.where(live, err / total, torch.zeros_like(err))
    return torch.where(err == 0, torch.zeros_like(ratio), ratio), err


def on_oracle_rows(t: torch.Tensor, ref: Reference) -> torch.Tensor:
    """An output (or lse) of the whole case on the oracle's rows (its sample of the query rows, when it
    took one), in float64 where the oracle is."""
    t = t if ref.rows is None else t.index_select(2, ref.rows.to(t.device))
    return t.detach().to(ref.out.device, torch.float64)


def _on_host(*values, device) -> list:
    """Device scalars (0-d tensors, or Python numbers) as Python floats, in one transfer."""
    return torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]).tolist()


@dataclass
class _Compared:
    """An output beside the oracle: its error, error/budget and the bad elements of each kind."""

    budget: Budget
    regime: str | None
    got: torch.Tensor  # the output on the oracle's rows, float64
    lse: torch.Tensor | None  # the same for the lse
    err: torch.Tensor
    ratio: torch.Tensor  # err / budget
    over: torch.Tensor  # over the budget
    nonfinite: torch.Tensor  # non-finite where the oracle is finite
    lse_err: torch.Tensor | None
    bad_lse: torch.Tensor | None  # lse rows off by more than their budget

    @classmethod
    def of(cls, out, lse, budget: Budget, regime: str | None, lse_base: str = "e") -> "_Compared":
        ref = budget.reference
        got = on_oracle_rows(out, ref)
        got_lse = None if lse is None else on_oracle_rows(lse, ref) * (LN2 if lse_base == "2" else 1.0)
        empty = ref.empty_rows
        ratio, err = error_ratios(got, ref.out, budget.total, empty)
        nonfinite = ~empty[..., None].expand_as(got) & ~torch.isfinite(got)
        lse_err = bad_lse = None
        if got_lse is not None:
            lse_err = (got_lse - ref.lse).abs()
            bad_lse = ~empty & ~(lse_err <= budget.lse_total)  # NaN counts as bad
        return cls(budget, regime, got, got_lse, err, ratio, ratio > 1, nonfinite, lse_err, bad_lse)

    @property
    def ref(self) -> Reference:
        return self.budget.reference

    @property
    def empty(self) -> torch.Tensor:
        """The rows with no visible key."""
        return self.ref.empty_rows

    def diagnose(self, bad: torch.Tensor) -> str:
        return diagnose_elements(bad, self.ref.shapes, self.ref.rows, self.empty)


def compare(out: torch.Tensor, lse: torch.Tensor | None, budget: Budget, *, fully_masked_rows: str = "any",
            regime: str | None = None, lse_base: str = "e",
            empty_lse: str | None = None) -> tuple[list[Finding], float]:
    """Findings of an output against the oracle and its budget, and the largest error/budget ratio.

    ``lse_base``: the returned lse is ``log`` (``"e"``) or ``log2`` (``"2"``) of the softmax denominator;
    ``empty_lse``: what it is on a row with no visible key (``"-inf"``, ``"+inf"``, ``"any"``; None: -inf
    where ``fully_masked_rows`` is ``"zero"``, anything otherwise)."""
    c = _Compared.of(out, lse, budget, regime, lse_base)
    # One transfer for every decision below: each separate read would wait for the device.
    any_nonfinite, any_over, any_empty, any_bad_lse, max_ratio = _on_host(
        c.nonfinite.any(), c.over.any(), c.empty.any(), False if c.bad_lse is None else c.bad_lse.any(),
        c.ratio.max() if c.ratio.numel() else math.nan, device=c.got.device)
    findings: list[Finding] = []
    if any_nonfinite:
        findings.append(_nonfinite(c))
    if any_over:
        findings.append(_over_budget(c, max_ratio))
    if empty_lse is None:
        empty_lse = "-inf" if fully_masked_rows == "zero" else "any"
    if any_empty and (fully_masked_rows != "any" or (c.lse is not None and empty_lse != "any")):
        findings += _masked_row_promise(c, fully_masked_rows, empty_lse)
    if any_bad_lse:
        findings.append(_lse(c, lse_base))
    return findings, max_ratio


def _nonfinite(c: _Compared) -> Finding:
    idx = first_index(c.nonfinite)
    return Finding("nonfinite", BUG, f"{c.got[idx]} where the oracle is finite: " + c.diagnose(c.nonfinite),
                   index=idx, regime=c.regime)


def _over_budget(c: _Compared, max_ratio: float) -> Finding:
    """The worst element over the budget, with where the bad elements sit and the key set of its row."""
    idx = first_index(c.ratio == max_ratio)
    keys = _key_set(c, idx)
    diagnosis = c.diagnose(c.over) + (f"; {keys}" if keys else "")
    return Finding("over_budget", BUG, diagnosis, index=idx, error=float(c.err[idx]),
                   budget=c.budget.breakdown(idx), ratio=float(c.ratio[idx]), regime=c.regime,
                   details={"elements_over": int(c.over.sum()), "keys": keys})


def _key_set(c: _Compared, idx: tuple) -> str | None:
    """The wrong set of keys the row of ``idx`` is attention over (None without the oracle's inputs)."""
    ref = c.ref
    if ref.inputs is None:
        return None
    return which_keys(c.got[idx[:3]], ref.inputs, idx, c.budget.total[idx[:3]],
                      row=None if ref.rows is None else int(ref.rows[idx[2]]))


def _masked_row_promise(c: _Compared, promise: str, empty_lse: str) -> list[Finding]:
    """Rows with no visible key that do not hold the spec's promise: 0, or NaN; their lse ``empty_lse``."""
    rows_out = c.got[c.empty]
    broken = torch.zeros(rows_out.shape[0], dtype=torch.bool, device=rows_out.device)
    if promise == "zero":
        broken = ~(rows_out == 0).all(-1)
    elif promise == "nan":
        broken = ~torch.isnan(rows_out).all(-1)
    out_broken = int(broken.sum())
    if c.lse is not None and empty_lse != "any":
        broken |= ~(c.lse[c.empty] == (-math.inf if empty_lse == "-inf" else math.inf))
    if not bool(broken.any()):
        return []
    what = f"{promise!r}" if promise != "any" else "promised"
    if int(broken.sum()) > out_broken:
        what += f" with lse {empty_lse} (first lse {float(c.lse[c.empty][broken][0]):.6g})"
    example = rows_out[broken][0][:4].tolist()
    return [Finding("masked_row_promise", BUG, f"{int(broken.sum())} of {int(c.empty.sum())} rows with no visible "
                    f"key are not {what} (first values {example})", regime=c.regime)]


def _other_base(c: _Compared, lse_base: str) -> str:
    """The convention the bad lse rows match instead of the declared one, as a note (or "")."""
    other = c.lse / LN2 if lse_base == "2" else c.lse * LN2  # the kernel's values read in the other base
    off = (other - c.ref.lse).abs()
    if bool((off[c.bad_lse] <= c.budget.lse_total[c.bad_lse]).all()):
        declared, found = ("log2", "natural log") if lse_base == "2" else ("natural log", "log2")
        return f"; matches an lse in {found}, the spec declares {declared} (lse_base={lse_base!r})"
    return ""


def _lse(c: _Compared, lse_base: str = "e") -> Finding:
    live_rows = ~c.empty
    lse_ratio = torch.where(live_rows, c.lse_err / c.budget.lse_total, torch.zeros_like(c.lse_err))
    idx = first_index(c.bad_lse)
    scale = LN2 if lse_base == "2" else 1.0
    return Finding(
        "lse", BUG, f"lse off on {int(c.bad_lse.sum())} of {int(live_rows.sum())} rows "
        f"(got {float(c.lse[idx]) / scale:.6g}, exact {float(c.ref.lse[idx]) / scale:.6g})" + _other_base(c, lse_base),
        index=idx, error=float(c.lse_err[idx]),
        ratio=float(torch.nan_to_num(lse_ratio, nan=math.inf, posinf=math.inf)[idx]),
        budget={"total": float(c.budget.lse_total[idx])}, regime=c.regime)


def inputs_written(want: tuple, given: tuple, regime: str | None) -> list[Finding]:
    """A finding for each of q, k and v (``given``, as the kernel was handed them) whose bits are no longer those of
    ``want``: the kernel wrote into its caller's tensor (it was handed copies, so the case and the oracle still hold
    the inputs)."""
    out = []
    for name, tensor, before in zip("qkv", given, want):
        changed = raw_bits(tensor.detach().cpu()) != raw_bits(before.cpu())  # a GPU campaign's case
        if bool(changed.any()):
            out.append(Finding("input_written", BUG, f"the kernel wrote into its input {name}: {int(changed.sum()):,} "
                               f"of {changed.numel():,} elements changed (a caller's tensor is not the kernel's to "
                               "change)", regime=regime, details={"tensor": name}))
    return out
