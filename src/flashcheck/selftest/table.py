"""The self-test's table: each row (variant x dtype), caught or not, by which check, after how many cases,
beside the field's usual rules; then the totals, the rows a deadline stopped and the correct rows' margins."""

from __future__ import annotations

import math

from ..contract.features import FEATURES
from ..judge.verdict import rate_bound
from ..numerics.gradients import GRADIENTS
from .rows import Detection, Row

__all__ = ["format_table"]


def format_table(rows: list[Row]) -> str:
    """One text table: each variant, caught or not, by which check, after how many cases."""
    def cell(det: "Detection", correct: bool, stopped: bool) -> str:
        if det.how == "n/a" and det.first_case is None:
            return "n/a"
        if correct:
            return "ok" if det.first_case is None else f"FALSE ALARM x{det.false_alarms}"
        return f"caught @{det.first_case}" if det.first_case else "stopped" if stopped else "missed"

    anchor_keys = list(rows[0].anchors) if rows else []
    head = ["variant", "dtype", "cases", "flashcheck", "check", "ratio"] + anchor_keys
    lines = []
    for r in rows:
        if r.correct:
            fc = "ok" if r.flashcheck.first_case is None else f"FALSE ALARM x{r.flashcheck.false_alarms}"
            ratio = f"max {r.max_ratio:.3g}" + (f" susp {r.suspicious}" if r.suspicious else "")
        else:
            fc = f"BUG @{r.flashcheck.first_case}" if r.flashcheck.first_case else "STOPPED" if r.stopped else "MISSED"
            ratio = f"min {r.min_caught_ratio:.3g}" if math.isfinite(r.min_caught_ratio) else "-"
        lines.append([r.variant, r.dtype, f"{r.cases}{' (stopped)' if r.stopped else ''}", fc, r.flashcheck.how or "-", ratio]
                     + [cell(r.anchors[k], r.correct, r.stopped) for k in anchor_keys])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    out = [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*line) for line in lines]
    return "\n".join(out + _summary(rows, anchor_keys))


def _summary(rows: list[Row], anchor_keys: list) -> list:
    """Per detector, planted bugs caught and false alarms; rows the deadline stopped; the correct rows' margins."""
    bugs = [r for r in rows if not r.correct]
    good = [r for r in rows if r.correct]
    summary = [""]
    for label, det_of in [("flashcheck", lambda r: r.flashcheck)] + [(k, lambda r, k=k: r.anchors[k]) for k in anchor_keys]:
        caught = sum(1 for r in bugs if det_of(r).first_case)
        alarms = sum(1 for r in good if det_of(r).first_case)
        defined = sum(1 for r in bugs if not (det_of(r).how == "n/a" and det_of(r).first_case is None))
        summary.append(f"{label:28} caught {caught}/{defined} planted bugs (variant x dtype); "
                       f"false alarms on {alarms}/{len(good)} correct rows")
    stopped = [r for r in rows if r.stopped]
    if stopped:
        summary.append(f"time budget: {len(stopped)} rows stopped before their last case "
                       f"({sum(1 for r in stopped if not r.correct and not r.flashcheck.first_case)} planted bugs "
                       "not caught by then)")
    broken = [r for r in rows if r.errors]
    if broken:
        summary.append(f"internal errors: {sum(r.errors for r in broken)} cases raised inside flashcheck, on "
                       + ", ".join(f"{r.variant} {r.dtype} ({r.errors})" for r in broken))
    cases_correct = sum(r.cases for r in good)
    summary.append(f"correct variants: {cases_correct} cases in all; " + ", ".join(
        f"{d}: max err/budget {max((r.max_ratio for r in good if r.dtype == d), default=0):.3g}{_by_gradient(good, d)}"
        for d in sorted({r.dtype for r in good})))
    features = _features(good)
    if features:
        summary.append(features)
    return summary


def _features(good: list[Row]) -> str:
    """The correct rows' judged cases per variant feature, with the failure rate each rules out when none
    failed (no BUG, no SUSPICIOUS in n cases: below :func:`rate_bound`, the sign-off's bound, at 95% on the
    drawn distribution); "" without features."""
    counts = {name: sum(r.features.get(name, 0) for r in good) for name in FEATURES}
    counts = {name: n for name, n in counts.items() if n}
    if not counts:
        return ""
    clean = not any(r.flashcheck.first_case or r.suspicious for r in good)
    parts = [f"{name} {n}" + (f" (rate < {100 * rate_bound(n):.2g}%)" if clean else "") for name, n in counts.items()]
    why = ("; none failed, so each rate is below 1 - 0.05^(1/n) (about 3/n) at 95%" if clean
           else "; some failed: no rate is ruled out")
    return "correct variants by feature (judged cases): " + ", ".join(parts) + why


def _by_gradient(rows: list[Row], dtype: str) -> str:
    """`` (dq 0.9, dk 0.8, dv 0.99)``: the largest err/budget of each gradient in ``dtype`` (backward rows)."""
    found = {k for r in rows if r.dtype == dtype for k in r.gradient_max}
    names = [k for k in GRADIENTS if k in found] + sorted(found - set(GRADIENTS))
    if not names:
        return ""
    worst = {k: max(r.gradient_max.get(k, 0.0) for r in rows if r.dtype == dtype) for k in names}
    return " (" + ", ".join(f"{k} {v:.3g}" for k, v in worst.items()) + ")"
