"""Verdicts and findings: what flashcheck concluded about one kernel on one case, and why."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from ..contract.formats import SCALE_FINDING

__all__ = ["PASS", "SUSPICIOUS", "BUG", "NO_CASES", "ANCHOR_FAIL", "ANCHOR_PASS", "NOT_APPLICABLE", "CONFIDENCE",
           "FINDING_KINDS", "RATIO_CEILING", "Finding", "Verdict", "from_json_number", "json_number", "keep_largest",
           "rate_bound", "run_verdict", "worst_status"]

PASS, SUSPICIOUS, BUG = "PASS", "SUSPICIOUS", "BUG"
# A run (campaign, merge, sign-off cell) that judged no case: never a pass.
NO_CASES = "NO_CASES"
# What one of the field's rules (judge.anchors) says of a case, in a verdict's and a record's "anchors".
ANCHOR_PASS, ANCHOR_FAIL, NOT_APPLICABLE = "pass", "fail", "n/a"
_RANK = {PASS: 0, SUSPICIOUS: 1, BUG: 2}
# The largest error/budget ratio told apart from a larger one: hypothesis's target phase climbs no higher, and the
# report's plots draw a non-finite ratio there.
RATIO_CEILING = 1e6

FINDING_KINDS = (
    "over_budget",          # error above the hard budget somewhere
    "nonfinite",            # NaN/inf where the oracle is finite
    "masked_row_promise",   # a fully masked row does not hold the spec's promised value
    "lse",                  # the returned lse is off
    "poison_leak",          # poisoned masked-out K/V or memory past a tensor changed the output
    "layout_dependence",    # same numbers, another memory layout, another output
    "nondeterminism",       # two identical calls, two outputs
    "crash",                # the kernel raised, or its worker process died
    "wrong_output",         # wrong shape, dtype or device
    "input_written",        # the kernel wrote into its q, k or v
    "reordering_outlier",   # inside the budget but far outside legal reorderings (SUSPICIOUS)
    "batch_dependence",     # a sequence alone differs from itself in a batch (only if the spec promises)
    "timeout",              # the kernel did not return within the campaign's per-case timeout
    "bias_shift_dependence",  # a constant added to a row's bias changed the output (or broke its budget)
    "split_dependence",     # another split count, other bits (only if the spec promises split invariance)
    "neutral_variant",      # a declared variant at its neutral value changed the output (or broke its budget)
    "order_dependence",     # a variant written in another order (a permuted index list) changed the output
    SCALE_FINDING,          # quantized inputs rescaled against their scales broke the budget
)


def json_number(x):
    """A float for JSON: finite values as they are, NaN and infinities as strings."""
    if x is None or isinstance(x, (int, bool)):
        return x
    x = float(x)
    return x if math.isfinite(x) else str(x)


def from_json_number(x):
    """The inverse of :func:`json_number`: ``"nan"``, ``"inf"``, ``"-inf"`` back to floats."""
    if x is None or isinstance(x, bool):
        return x
    return float(x)


def keep_largest(largest: dict, ratios: dict) -> None:
    """Raise each of ``largest`` (name -> err/budget) to the finite ``ratios`` of one more case."""
    for name, ratio in ratios.items():
        if math.isfinite(ratio):
            largest[name] = max(largest.get(name, 0.0), ratio)


def worst_status(statuses) -> str:
    return max(statuses, key=_RANK.__getitem__, default=PASS)


def run_verdict(findings, by_status: dict) -> str:
    """A run's verdict from its findings (dicts with a ``status``) and its judged cases counted by status:
    the worst status of either, or NO_CASES when there is neither."""
    statuses = [f.get("status") for f in findings] + [status for status, n in by_status.items() if n]
    statuses = [s for s in statuses if s in _RANK]
    return worst_status(statuses) if statuses else NO_CASES


CONFIDENCE = 0.95


def rate_bound(n: int, confidence: float = CONFIDENCE) -> float | None:
    """The exact one-sided upper ``confidence`` bound on the per-case failure rate after ``n`` independent
    cases drawn from one distribution, none of which failed: the rate p at which n clean cases in a row
    happen with probability 1 - confidence, ``(1 - p)**n = 1 - confidence``, so ``p = 1 - 0.05**(1/n)`` at
    95% (about 3/n, the "rule of three"). A defect hitting more cases than that would have shown with
    probability ``confidence``; it says nothing of inputs the distribution does not draw. None for n = 0."""
    if n <= 0:
        return None
    return 1.0 - (1.0 - confidence) ** (1.0 / n)


@dataclass
class Finding:
    """One thing wrong (or suspicious) with a kernel's output, with the evidence.

    ``index`` is the worst element (b, h, i, k) in the output's indices, ``error`` its distance to the
    oracle, ``budget`` its budget term by term (with ``total``), ``ratio`` error / budget total.
    """

    kind: str
    status: str
    diagnosis: str
    index: tuple | None = None
    error: float | None = None
    budget: dict | None = None
    ratio: float | None = None
    regime: str | None = None
    details: dict = field(default_factory=dict)

    def __post_init__(self):
        # A kind must be known, so that campaigns name its cause (campaign.causes): flashcheck's own defect if not.
        if self.kind not in FINDING_KINDS:
            raise ValueError(f"finding kind {self.kind!r} is not in FINDING_KINDS: add it there, with its cause")

    def summary(self) -> str:
        head = f"{self.status} {self.kind}: {self.diagnosis}"
        if self.index is not None and self.error is not None:
            head += f"\n    worst element {self.index}: error {self.error:.3e}"
            if self.ratio is not None:
                head += f" = {self.ratio:.3g} x budget"
        if self.budget:
            terms = ", ".join(f"{k} {v:.2e}" for k, v in self.budget.items() if k != "total")
            head += f"\n    budget {self.budget.get('total', math.nan):.3e}" + (f" = {terms}" if terms else "")
        return head

    def as_dict(self) -> dict:
        out = asdict(self)
        out["index"] = list(self.index) if self.index is not None else None
        out["error"], out["ratio"] = json_number(self.error), json_number(self.ratio)
        if self.budget:
            out["budget"] = {k: json_number(v) for k, v in self.budget.items()}
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Finding":
        """The finding that :meth:`as_dict` wrote (e.g. sent back by a worker process)."""
        data = dict(data)
        if data.get("index") is not None:
            data["index"] = tuple(data["index"])
        data["error"], data["ratio"] = from_json_number(data.get("error")), from_json_number(data.get("ratio"))
        if data.get("budget"):
            data["budget"] = {k: from_json_number(v) for k, v in data["budget"].items()}
        return cls(**data)


@dataclass
class Verdict:
    """PASS, SUSPICIOUS or BUG, with the findings that justify it and the margin seen."""

    status: str
    findings: list[Finding]
    max_ratio: float  # largest error / budget over every element checked (nan if nothing compared)
    kernel: str = ""
    case: str = ""
    regime: str | None = None
    elapsed: dict = field(default_factory=dict)
    output: object = field(default=None, repr=False, compare=False)  # the kernel's (out, lse), kept in memory
    # Why the case was not judged (e.g. "oom: ..."): no finding, and a campaign counts it apart.
    skipped: str | None = None
    # Information that is not a finding (e.g. batch dependence a spec does not rule out).
    notes: list = field(default_factory=list)
    properties: list = field(default_factory=list)  # the exact properties checked on this case
    # Triton kernel variants built during this case's kernel calls; their seconds are elapsed["compile"].
    compilations: int = 0
    # The largest error / budget of each part judged apart (the backward pass: dq, dk, dv).
    ratios: dict = field(default_factory=dict)
    # The field's rules on the same output (judge.anchors), where a sign-off asks: rule -> pass, fail or n/a.
    anchors: dict = field(default_factory=dict)

    @classmethod
    def from_findings(cls, findings, **kw) -> "Verdict":
        return cls(status=worst_status(f.status for f in findings), findings=list(findings), **kw)

    @property
    def ok(self) -> bool:
        return self.status == PASS

    def __str__(self) -> str:
        lines = [f"{self.status}: {self.kernel} on {self.case}", f"  max error/budget {self._ratios_text()}"]
        lines += ["  " + f.summary().replace("\n", "\n  ") for f in self.findings]
        if self.skipped:
            lines.append(f"  skipped, not judged: {self.skipped}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _ratios_text(self) -> str:
        # max_ratio is the output's; an lse judged apart says its own, so that an lse-only finding does
        # not read "max error/budget 0".
        text = f"{self.max_ratio:.3g}"
        lse = [f.ratio for f in self.findings if f.kind == "lse" and f.ratio is not None]
        return f"{text} (out), {max(lse):.3g} (lse)" if lse else text

    def as_dict(self) -> dict:
        return {"status": self.status, "kernel": self.kernel, "case": self.case, "regime": self.regime,
                "max_ratio": json_number(self.max_ratio), "elapsed": self.elapsed,
                "findings": [f.as_dict() for f in self.findings], "skipped": self.skipped,
                "notes": list(self.notes), "properties": list(self.properties), "compilations": self.compilations,
                "ratios": {k: json_number(v) for k, v in self.ratios.items()},
                **({"anchors": dict(self.anchors)} if self.anchors else {})}

    @classmethod
    def from_dict(cls, data: dict) -> "Verdict":
        """The verdict that :meth:`as_dict` wrote, without the kernel's output (which stays where it ran)."""
        return cls(status=data["status"], findings=[Finding.from_dict(f) for f in data.get("findings", [])],
                   max_ratio=from_json_number(data.get("max_ratio", "nan")), kernel=data.get("kernel", ""),
                   case=data.get("case", ""), regime=data.get("regime"), elapsed=dict(data.get("elapsed") or {}),
                   skipped=data.get("skipped"), notes=list(data.get("notes") or []),
                   properties=list(data.get("properties") or []), compilations=int(data.get("compilations") or 0),
                   ratios={k: from_json_number(v) for k, v in (data.get("ratios") or {}).items()},
                   anchors=dict(data.get("anchors") or {}))
