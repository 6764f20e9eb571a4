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
from dataclasses import dataclass
from pathlib import Path

from ..campaign.config import CampaignConfig, Limits, Storage, Target
from ..campaign.parallel import run_campaigns
from ..campaign.setup import prepare_campaign
from ..campaign.summary import CampaignSummary
from ..errors import InvalidArgument
from ..files import check_writable_folder, write_json
from ..inputs.presets import Preset
from .machine import flashcheck_version, machine_info
from .model import build_report
from .plots import check_plotting
from .render import write_report

__all__ = ["SignoffConfig", "plan_signoff", "run_signoff"]


@dataclass(frozen=True)
class SignoffConfig:
    """A sign-off: ``kernels`` (by name), their report written into ``out``. Each campaign runs on ``device``
    with ``preset`` over ``dtypes`` (default: the preset's, those each kernel supports), the backward pass
    too with ``backward``, in ``jobs`` worker processes, ``max_examples`` drawn cases (default: the
    preset's) from ``seed``; ``time_budget`` (default: the preset's) is the whole sign-off's. A kernel, pass
    and dtype needs ``min_cases`` judged cases, and each value regime a campaign drew ``min_regime_cases``
    in each dtype (None: no such minimum). ``argv``: the command the report names (default this process's).
    ``cluster``: a Ray address (:func:`~flashcheck.campaign.ray_transport.check_cluster`) whose nodes run the
    workers instead of this host."""

    kernels: tuple
    out: Path
    device: str
    preset: Preset
    backward: bool = False
    jobs: int = 1
    dtypes: tuple | None = None
    max_examples: int | None = None
    time_budget: float | None = None
    seed: int | None = None
    min_cases: int = 100
    min_regime_cases: int | None = None
    argv: tuple | None = None
    cluster: str | None = None


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text).strip("-")


def plan_signoff(config: SignoffConfig) -> tuple[list, list]:
    """``(plan, not_checked)``: one ``(kernel, pass, dtypes)`` per campaign, and what is left out and why.
    A kernel that cannot load or supports none of the dtypes is a usage error, before anything runs."""
    if not config.kernels:
        raise InvalidArgument("kernels", list(config.kernels), "no kernel to sign off", "Name at least one kernel.")
    plan, not_checked = [], []
    for name in dict.fromkeys(config.kernels):
        prepared = prepare_campaign(CampaignConfig(Target(name, config.device, config.preset, config.dtypes)))
        resolved, chosen = prepared.kernel, prepared.dtypes
        wanted = list(config.preset.dtypes if config.dtypes is None else config.dtypes)
        not_checked += [f"{resolved.name}: {d} (the kernel's spec does not support it)" for d in wanted
                        if d not in chosen]
        plan.append((name, "forward", chosen))
        problem = resolved.spec.backward_problem() if config.backward else None
        if config.backward and not problem:
            plan.append((name, "backward", chosen))
        elif config.backward:
            not_checked.append(f"{resolved.name}: backward (the kernel's spec {problem})")
    return plan, not_checked


def run_signoff(config: SignoffConfig, on_campaign=None) -> dict:
    """Run the sign-off's campaigns and write the report into ``config.out``; returns the report.
    ``on_campaign(kernel, pass, summary)`` is called as each campaign ends (its
    :class:`~flashcheck.campaign.summary.CampaignSummary`)."""
    out = Path(config.out)
    check_plotting()
    plan, not_checked = plan_signoff(config)
    check_writable_folder("--out", out)  # after the kernels load, so that a usage error leaves no folder behind
    budget = config.time_budget if config.time_budget is not None else config.preset.time_budget
    deadline = time.monotonic() + budget if budget else None
    runs = []
    for i, (kernel, pass_, chosen) in enumerate(plan):
        share = None if deadline is None else max(1.0, (deadline - time.monotonic()) / (len(plan) - i))
        summary = _run_one(config, kernel, pass_, chosen, share)
        runs.append(_written(out, kernel, pass_, chosen, summary))
        if on_campaign is not None:
            on_campaign(kernel, pass_, summary)
        if _interrupted(summary):  # Ctrl-C ends the sign-off, with a report of what ran
            not_checked += [f"{k}: {p} (the sign-off was interrupted before it)" for k, p, _ in plan[i + 1:]]
            break
    argv = list(config.argv) if config.argv is not None else ["flashcheck", *sys.argv[1:]]
    meta = {"command": shlex.join(argv), "preset": config.preset.name, "seed": config.seed,
            "device": str(config.device), "machine": machine_info(config.device), "flashcheck": flashcheck_version(),
            "not_checked": not_checked}
    report = build_report(runs, out=out, meta=meta, min_cases=config.min_cases,
                          min_regime_cases=config.min_regime_cases)
    write_report(report, out)
    return report


def _interrupted(summary: CampaignSummary) -> bool:
    stopped = summary.stopped
    return "interrupted" in (stopped if isinstance(stopped, list) else [stopped])


def _campaign_name(kernel: str, pass_: str) -> str:
    return f"{_slug(kernel)}-{pass_}"


def _run_one(config: SignoffConfig, kernel: str, pass_: str, dtypes: list, time_budget) -> CampaignSummary:
    """One keep-going campaign of the sign-off, its findings in the report's corpus."""
    corpus = Path(config.out) / "corpus" / _campaign_name(kernel, pass_)
    campaign = CampaignConfig(Target(kernel, config.device, config.preset, tuple(dtypes), backward=pass_ == "backward"),
                              limits=Limits(config.max_examples, time_budget, keep_going=True),
                              storage=Storage(corpus, records=True)).replace(seed=config.seed)
    return run_campaigns(campaign, jobs=config.jobs, cluster=config.cluster)


def _written(out: Path, kernel: str, pass_: str, dtypes: list, summary: CampaignSummary) -> dict:
    """The campaign's summary written beside the report; its entry in the report's runs."""
    name = _campaign_name(kernel, pass_)
    summary_path = out / "campaigns" / f"{name}.json"
    data = summary.as_dict()
    write_json(summary_path, data)
    return {"pass": pass_, "dtypes": dtypes, "summary": data, "summary_path": str(summary_path),
            "corpus": str(out / "corpus" / name)}
