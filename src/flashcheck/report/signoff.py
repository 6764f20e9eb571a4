"""``flashcheck signoff``: keep-going campaigns over kernels and passes, then the report a release files.

Each kernel gets one campaign per pass (the forward, and the backward with ``backward=True`` where its
spec declares one) over every dtype that both the preset and the kernel take. The time budget is the
whole sign-off's: each campaign gets an even share of what is left, so time a quick campaign leaves
goes to the next. Every campaign's summary is written the moment it ends, and its findings are saved in
the corpus the moment they are found, so an interrupted sign-off loses nothing; ``report.json``,
``report.md`` and ``index.html`` follow.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from ..campaign.parallel import run_campaigns
from ..campaign.setup import prepare_campaign
from ..errors import InvalidArgument
from ..files import check_writable_folder, write_json
from .machine import flashcheck_version, machine_info
from .model import build_report
from .plots import check_plotting
from .render import write_report

__all__ = ["plan_signoff", "run_signoff"]


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


def plan_signoff(kernels: list[str], *, device: str, preset, backward: bool, dtypes=None) -> tuple[list, list]:
    """``(plan, not_checked)``: one ``(kernel, pass, dtypes)`` per campaign, and what is left out and why.
    A kernel that cannot load or supports none of the dtypes is a usage error, before anything runs."""
    if not kernels:
        raise InvalidArgument("kernels", kernels, "no kernel to sign off", "Name at least one kernel.")
    plan, not_checked = [], []
    for name in dict.fromkeys(kernels):
        resolved, _, chosen = prepare_campaign(name, device=device, preset=preset, dtypes=dtypes)
        wanted = list(preset.dtypes if dtypes is None else dtypes)
        not_checked += [f"{resolved.name}: {d} (the kernel's spec does not support it)" for d in wanted
                        if d not in chosen]
        plan.append((name, "forward", chosen))
        problem = resolved.spec.backward_problem() if backward else None
        if backward and not problem:
            plan.append((name, "backward", chosen))
        elif backward:
            not_checked.append(f"{resolved.name}: backward (the kernel's spec {problem})")
    return plan, not_checked


def run_signoff(kernels: list[str], *, out, device: str, preset, backward: bool = False, jobs: int = 1,
                dtypes=None, max_examples: int | None = None, time_budget: float | None = None,
                seed: int | None = None, min_cases: int = 100, min_regime_cases: int | None = None,
                on_campaign=None, argv=None) -> dict:
    """Run the sign-off's campaigns and write the report into ``out``; returns the report.
    ``on_campaign(kernel, pass, summary)`` is called as each campaign ends. ``min_regime_cases``: judged
    cases each value regime a campaign drew needs per dtype (None: no such minimum)."""
    out = Path(out)
    check_plotting()
    plan, not_checked = plan_signoff(kernels, device=device, preset=preset, backward=backward, dtypes=dtypes)
    check_writable_folder("--out", out)  # after the kernels load, so that a usage error leaves no folder behind
    budget = time_budget if time_budget is not None else preset.time_budget
    deadline = time.monotonic() + budget if budget else None
    runs = []
    for i, (kernel, pass_, chosen) in enumerate(plan):
        share = None if deadline is None else max(1.0, (deadline - time.monotonic()) / (len(plan) - i))
        runs.append(_run_one(kernel, pass_, chosen, out=out, device=device, preset=preset, jobs=jobs,
                             max_examples=max_examples, time_budget=share, seed=seed))
        if on_campaign is not None:
            on_campaign(kernel, pass_, runs[-1]["summary"])
        if _interrupted(runs[-1]["summary"]):  # Ctrl-C ends the sign-off, with a report of what ran
            not_checked += [f"{k}: {p} (the sign-off was interrupted before it)" for k, p, _ in plan[i + 1:]]
            break
    meta = {"command": shlex.join(argv if argv is not None else ["flashcheck", *sys.argv[1:]]),
            "preset": preset.name, "seed": seed, "device": str(device), "machine": machine_info(device),
            "flashcheck": flashcheck_version(), "not_checked": not_checked}
    report = build_report(runs, out=out, meta=meta, min_cases=min_cases, min_regime_cases=min_regime_cases)
    write_report(report, out)
    return report


def _interrupted(summary: dict) -> bool:
    stopped = summary["stopped"]
    return "interrupted" in (stopped if isinstance(stopped, list) else [stopped])


def _run_one(kernel: str, pass_: str, dtypes: list, *, out: Path, device: str, preset, jobs: int,
             max_examples, time_budget, seed) -> dict:
    name = f"{_slug(kernel)}-{pass_}"
    corpus = out / "corpus" / name
    summary = run_campaigns(kernel, jobs=jobs, device=device, preset=preset, dtypes=dtypes, max_examples=max_examples,
                            time_budget=time_budget, seed=seed, corpus=corpus, keep_going=True,
                            backward=pass_ == "backward", records=True)
    summary_path = out / "campaigns" / f"{name}.json"
    write_json(summary_path, summary)
    return {"pass": pass_, "dtypes": dtypes, "summary": summary, "summary_path": str(summary_path),
            "corpus": str(corpus)}
