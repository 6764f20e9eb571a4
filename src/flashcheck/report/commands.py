"""The ``signoff`` and ``report`` commands (parsed in :mod:`flashcheck.cli`)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import InvalidArgument
from ..files import check_writable_folder

__all__ = ["cmd_report", "cmd_signoff"]

EXIT_SIGNED_OFF, EXIT_BLOCKED, EXIT_NO_CASES = 0, 1, 3


def cmd_signoff(args, device: str) -> int:
    from ..campaign.parallel import check_jobs
    from ..inputs.presets import load_preset
    from .signoff import run_signoff

    preset = load_preset(args.preset)  # the CLI checked the counts and durations
    jobs = check_jobs(args.jobs if args.jobs is not None else preset.jobs)

    def ended(kernel, pass_, summary):
        bugs = len(summary.get("bugs") or [])
        print(f"signoff: {kernel} {pass_}: {summary['verdict']}, {summary['cases']} cases in "
              f"{summary['elapsed_s']:.0f} s, {bugs} distinct bugs", file=sys.stderr, flush=True)

    report = run_signoff(args.kernels, out=args.out, device=device, preset=preset, backward=args.backward,
                         jobs=jobs, dtypes=args.dtype, max_examples=args.max_examples, time_budget=args.time_budget,
                         seed=args.seed, min_cases=args.min_cases, on_campaign=ended,
                         argv=["flashcheck", "signoff", *args.argv])
    _print(report, Path(args.out))
    if not report["totals"]["judged"]:
        return EXIT_NO_CASES
    return EXIT_SIGNED_OFF if report["status"] == "SIGNED-OFF" else EXIT_BLOCKED


def _print(report: dict, out: Path) -> None:
    t = report["totals"]
    print(f"flashcheck signoff: {report['status']} ({t['judged']} cases judged, {t['bugs']} distinct bugs, "
          f"{t['suspicious']} suspicious, {t['elapsed_s']:.0f} s)")
    for c in report["campaigns"]:
        for cell in c["dtypes"]:
            reasons = cell["reasons"]
            why = f": {reasons[0]}" if reasons else ""
            why += f" (+{len(reasons) - 1} more)" if len(reasons) > 1 else ""
            print(f"  {cell['status']:10} {c['kernel']} {c['pass']} {cell['dtype']}, {cell['judged']} cases{why}")
    print(f"  report: {out / 'index.html'} ({out / 'report.md'}, {out / 'report.json'})")


def cmd_report(args) -> int:
    from .compare import write_comparison
    from .model import load_report
    from .render import write_report

    reports = [load_report(d) for d in args.reports]
    if len(reports) == 1:
        out = check_writable_folder("--out", args.out or args.reports[0])  # --out defaults to DIR
        write_report(reports[0], out)
        print(f"flashcheck report: {reports[0]['status']}: {out / 'index.html'} and {out / 'report.md'}")
        return EXIT_SIGNED_OFF
    if args.out is None:
        raise InvalidArgument("--out", None, f"{len(reports)} reports make a comparison, which needs a folder",
                              "Pass --out DIR.")
    check_writable_folder("--out", args.out)
    names = _names(args.reports)
    write_comparison(reports, names, args.out)
    print(f"flashcheck report: {len(reports)} reports side by side: {Path(args.out) / 'compare.html'} and "
          f"{Path(args.out) / 'compare.md'}")
    return EXIT_SIGNED_OFF


def _names(paths: list[str]) -> list[str]:
    """Short names for the reports: their folders' names, made unique."""
    names = []
    for p in paths:
        name = Path(p).resolve().name or str(p)
        names.append(name if name not in names else f"{name} ({len(names) + 1})")
    return names
