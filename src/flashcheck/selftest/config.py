"""What a self-test run is asked to do: one frozen record, from ``flashcheck selftest``'s options to
:func:`flashcheck.selftest.run.run_selftest`, or pickled to each ``selftest --jobs`` worker."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SelftestConfig"]


@dataclass(frozen=True)
class SelftestConfig:
    """The rows: each subject (``names``, default all; ``which``: ``"all"``, ``"correct"`` or ``"bugs"``)
    in each of ``dtypes`` that it and its kernel take, of the forward pass or (``backward``) the backward.
    The cases: ``cases`` drawn per correct row, at most ``bug_cases`` per planted bug (it stops once every
    detector fired), from ``seed``, sequences up to ``max_n``, head dims ``head_dims`` (None: the usual).
    ``time_budget`` (seconds) stops rows early, marked stopped; ``corpus``: a folder where each case a
    correct kernel fails (BUG or SUSPICIOUS) is saved as it is found."""

    device: str
    dtypes: tuple = ("fp16", "fp32")
    names: tuple | None = None
    which: str = "all"
    backward: bool = False
    cases: int = 200
    bug_cases: int = 60
    seed: int = 0
    max_n: int = 160
    head_dims: tuple | None = None
    time_budget: float | None = None
    corpus: str | None = None
