"""Which bugs the defect models describe, and running them where flashcheck's own failure while matching must not
cost the caller its result: a campaign's finding, a replay's verdict, a reproducer's files.

The models describe a kernel's output on the case itself: a BUG whose findings are numerical
(:data:`NUMERICAL_KINDS`), not a crash, a broken calling convention or a property's rerun (a second call, another
layout, poisoned memory). :func:`explained` runs :func:`~flashcheck.defects.explain` on such a case and turns an
exception of flashcheck's into the explanation's note: what the kernel did is judged already, and flashcheck's
defect is never the kernel's.
"""

from __future__ import annotations

from ..judge.skips import one_line
from ..judge.verdict import BUG
from .matching import MAX_SCORES, Explanation, explain

__all__ = ["NUMERICAL_KINDS", "describes", "explained", "explained_verdict", "not_run", "too_large"]

# The finding kinds about the output of the case's own run, which a defect model reproduces.
NUMERICAL_KINDS = frozenset(("over_budget", "nonfinite", "lse", "masked_row_promise"))


def describes(verdict) -> bool:
    """Whether the models describe ``verdict``: a BUG whose failing findings are all numerical, about the case's own
    output (a finding of the layout property's rerun, in another layout, is not)."""
    kinds = {f.kind for f in verdict.findings if f.status == BUG and not (f.details or {}).get("layout")}
    return verdict.status == BUG and bool(kinds) and kinds <= NUMERICAL_KINDS


def not_run(why: str) -> Explanation:
    """The explanation of a case the models did not run on, saying ``why``."""
    return Explanation(note=f"not run: {why}")


def too_large(case) -> str | None:
    """Why the models would not run on ``case`` for its size, or None: the limit :func:`explain` applies once the
    kernel and the oracle have run, applied before either does (a case as found on a GPU can take minutes)."""
    s = case.shapes
    scores = s.batch * s.heads_q * s.n_q * s.n_k
    if scores <= MAX_SCORES:
        return None
    return f"the case has {scores:,} scores, past the {MAX_SCORES:,} the models run on (shrink it first)"


def explained(kernel, case, *, device, verdict=None) -> Explanation:
    """:func:`explain` of ``kernel`` on ``case`` (``verdict``: the output of that run, to take instead of running the
    kernel again); a case too large, or flashcheck raising while it matches, gives a note."""
    large = too_large(case)
    if large:
        return not_run(large)
    try:
        return explain(kernel, case, device=device, verdict=verdict)
    except Exception as exc:  # flashcheck's defect, not the kernel's: the kernel's own calls end in a verdict
        return not_run(f"flashcheck failed while matching ({one_line(exc)})")


def explained_verdict(kernel, case, verdict, *, device) -> Explanation | None:
    """:func:`explained` of ``verdict``, the output of ``kernel`` on ``case`` (taken, the kernel not run again), or
    None where the models do not describe it (:func:`describes`)."""
    return explained(kernel, case, device=device, verdict=verdict) if describes(verdict) else None
