"""``flashcheck signoff``: keep-going campaigns over kernels, then a report to file
(:mod:`flashcheck.report.signoff`); ``flashcheck report``: re-render one report, or compare several.

Exit status of ``signoff``: 0 SIGNED-OFF, 1 BLOCKED, 3 when no case was judged at all.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ..words import counted, wrapped
from .options import (
    EXIT_BUG,
    EXIT_NO_CASES,
    EXIT_OK,
    add_backward,
    add_cluster,
    add_device,
    add_dtype,
    add_jobs,
    add_max_examples,
    add_preset,
    add_seed,
    add_time_budget,
    choose_device,
    importable_from_cwd,
    whole_number,
)

__all__ = ["add_parser", "run", "run_report"]


def add_parser(subparsers) -> None:
    """The ``signoff`` and ``report`` commands."""
    signoff = subparsers.add_parser("signoff", help="keep-going campaigns over kernels, then a report to file",
                                    epilog="exit status: 0 SIGNED-OFF, 1 BLOCKED, 2 usage error, 3 no case judged")
    signoff.set_defaults(run=run)
    signoff.add_argument("kernels", nargs="+", metavar="KERNEL",
                         help="kernels to sign off, e.g. torch:math torch:flash")
    signoff.add_argument("--out", required=True, metavar="DIR",
                         help="report.json, report.md, index.html, plots/, campaigns/ and corpus/ go here")
    add_backward(signoff, help="also the backward pass of each kernel whose spec declares one")
    add_preset(signoff, default="signoff")
    add_jobs(signoff, help="worker processes per campaign, spread over the visible GPUs (default: the preset's)")
    add_cluster(signoff, help="run each campaign's --jobs workers on a Ray cluster's nodes; --out must be a folder "
                              "every node reaches (its corpus is each campaign's)")
    add_dtype(signoff)
    add_device(signoff)
    add_max_examples(signoff, help="cases per campaign")
    add_time_budget(signoff, help="seconds for the whole sign-off, shared by its campaigns (default: the preset's)")
    add_seed(signoff, help="fixes every campaign's cases")
    signoff.add_argument("--min-cases", type=whole_number, default=100, metavar="N",
                         help="judged cases a kernel, pass and dtype needs to be signed off (default 100)")
    signoff.add_argument("--min-regime-cases", type=whole_number, default=None, metavar="N",
                         help="judged cases each value regime a campaign drew needs in each dtype, so that a rare "
                              "regime is not signed off on a handful of cases (default: no such minimum)")

    report = subparsers.add_parser("report", help="re-render a sign-off report, or compare several side by side")
    report.set_defaults(run=run_report)
    report.add_argument("reports", nargs="+", metavar="DIR", help="folders written by flashcheck signoff --out")
    report.add_argument("--out", default=None, metavar="DIR",
                        help="where to write (one report: default its own folder; several: required)")


def run(args) -> int:
    """The sign-off: its campaigns, each reported as it ends, then the report written and summed up."""
    importable_from_cwd(args.kernels)
    device = choose_device(args.device)
    # on first use (torch among them): every command module loads at start-up
    from ..campaign.ray_transport import check_cluster
    from ..campaign.scheduler import check_jobs
    from ..inputs.presets import load_preset
    from ..report.signoff import SignoffConfig, run_signoff

    cluster = check_cluster(args.cluster)
    preset = load_preset(args.preset)  # the counts and durations are checked already
    config = SignoffConfig(tuple(args.kernels), Path(args.out), device, preset, backward=args.backward,
                           jobs=check_jobs(args.jobs if args.jobs is not None else preset.jobs), cluster=cluster,
                           dtypes=None if args.dtype is None else tuple(args.dtype), max_examples=args.max_examples,
                           time_budget=args.time_budget, seed=args.seed, min_cases=args.min_cases,
                           min_regime_cases=args.min_regime_cases, argv=("flashcheck", "signoff", *args.argv))
    report = run_signoff(config, on_campaign=_ended)
    _print_signoff(report, Path(args.out))
    if not report["totals"]["judged"]:
        return EXIT_NO_CASES
    return EXIT_OK if report["status"] == "SIGNED-OFF" else EXIT_BUG


def _ended(kernel: str, pass_: str, summary) -> None:
    """A campaign of the sign-off has ended (its :class:`~flashcheck.campaign.summary.CampaignSummary`)."""
    print(f"signoff: {kernel} {pass_}: {summary.verdict}, {counted(summary.cases, 'case')} in "
          f"{summary.elapsed_s:.0f} s, {counted(len(summary.bugs or []), 'distinct bug')}", file=sys.stderr, flush=True)


def _print_signoff(report: dict, out: Path) -> None:
    """The verdict, one line per kernel, pass and dtype, what was not checked (a kernel, pass or dtype the
    spec leaves out, or that an interrupted sign-off never ran), and where the report is."""
    t = report["totals"]
    print(f"flashcheck signoff: {report['status']} ({counted(t['judged'], 'case')} judged, "
          f"{counted(t['bugs'], 'distinct bug')}, "
          f"{t['suspicious']} suspicious, {t['elapsed_s']:.0f} s)")
    for c in report["campaigns"]:
        for cell in c["dtypes"]:
            reasons = cell["reasons"]
            why = f": {reasons[0]}" if reasons else ""
            why += f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            print(f"  {cell['status']:10} {c['kernel']} {c['pass']} {cell['dtype']}, {counted(cell['judged'], 'case')}{why}")
    for what in report["not_checked"]:
        print(wrapped(f"  not checked: {what}"))
    print(f"  report: {out / 'index.html'} ({out / 'report.md'}, {out / 'report.json'})")


def run_report(args) -> int:
    """One report re-rendered (into its own folder by default), or several compared (into ``--out``)."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..files import check_writable_folder
    from ..report.compare import write_comparison
    from ..report.model import load_report
    from ..report.render import write_report

    reports = [load_report(d) for d in args.reports]
    if len(reports) == 1:
        out = check_writable_folder("--out", args.out or args.reports[0])  # --out defaults to DIR
        write_report(reports[0], out)
        print(f"flashcheck report: {reports[0]['status']}: {out / 'index.html'} and {out / 'report.md'}")
        return EXIT_OK
    if args.out is None:
        raise InvalidArgument("DIR", args.reports, f"{len(reports)} reports make a comparison, which needs a "
                              "folder to write it in (--out)", "Pass --out DIR.")
    check_writable_folder("--out", args.out)
    names = _names(args.reports)
    write_comparison(reports, names, args.out)
    print(f"flashcheck report: {len(reports)} reports side by side: {Path(args.out) / 'compare.html'} and "
          f"{Path(args.out) / 'compare.md'}")
    return EXIT_OK


def _names(paths: list[str]) -> list[str]:
    """Short names for the reports: their folders' names, made unique."""
    names = []
    for p in paths:
        name = Path(p).resolve().name or str(p)
        names.append(name if name not in names else f"{name} ({len(names) + 1})")
    return names
