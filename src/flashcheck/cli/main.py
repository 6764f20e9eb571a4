"""The ``flashcheck`` command: ``fuzz`` a kernel, ``replay`` a saved case, ``selftest``, ``signoff``
kernels with a report, re-render or compare reports (``report``), list ``kernels`` and ``presets``.

Exit status: 0 when nothing is wrong, 1 when a bug was found, 2 on a usage error, 3 when a campaign judged
no case at all (every case skipped, or none run): its verdict is NO_CASES, never PASS.

``fuzz`` runs the kernel in a worker process: a kernel that dies is a ``crash`` finding, one that runs
past ``--case-timeout`` (default 300 s on a GPU, 600 s under the Triton interpreter) a ``timeout``
finding, and the campaign goes on with a fresh worker; cases that run out of device memory, or that the
kernel declines (``flashcheck.Unsupported``), are skipped and counted. Ctrl-C or SIGTERM ends a campaign
early with its summary written and its corpus kept (exit 1 if a bug was found before, else 0).
``--jobs N`` runs the campaign in N worker processes (spread over the visible GPUs) and writes one merged
summary (:mod:`flashcheck.campaign.parallel`); ``selftest --jobs N`` runs its rows in N processes.

Time to the first case: ``fuzz`` starts the kernel's worker process before this process imports torch
(nothing here imports it at module level, nor does ``import flashcheck``), so the worker imports torch
and loads the kernel while this process imports its own and prepares the campaign; each ``--jobs``
worker does the same. The summary's ``first_case_s`` is the seconds from the start of the ``flashcheck``
process (from the call, when :func:`main` is given ``argv``) to the end of the first judged case.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

from ..contract.formats import DEVICES, DTYPES

EXIT_OK, EXIT_BUG, EXIT_USAGE, EXIT_NO_CASES = 0, 1, 2, 3
_FUZZ_EPILOG = """exit status: 0 nothing wrong (PASS or SUSPICIOUS), 1 a bug was found (BUG), 2 usage error,
3 no case was judged (NO_CASES: every case skipped, e.g. out of memory or unsupported, or none run)"""
_DEVICE_HELP = "cpu runs Triton kernels under the Triton interpreter (default: cuda if available)"
_DESCRIPTION = ("Numerical property testing for tiled (flash) attention kernels: fuzz a kernel, replay a saved "
                "case, self-test, sign off kernels with a report.")


# Count and duration options: 0 or less would check nothing (or mean "the default" by accident).
_COUNTS = {"--max-examples": "cases", "--jobs": "worker processes", "--cases": "cases", "--bug-cases": "cases",
           "--max-n": "keys", "--chunk": "cases", "--min-cases": "judged cases"}
_DURATIONS = ("--time-budget", "--case-timeout")


def _check_counts(args) -> None:
    """Every count option a whole number >= 1 and every duration positive, before anything runs."""
    from ..errors import InvalidArgument

    for option in (*_COUNTS, *_DURATIONS):
        value = getattr(args, option[2:].replace("-", "_"), None)
        if value is None:
            continue
        if option in _COUNTS and value < 1:
            raise InvalidArgument(option, value, f"expected a number of {_COUNTS[option]}, at least 1",
                                  f"Pass e.g. {option} 4, or leave it out for the default.")
        if option in _DURATIONS and not (value > 0 and math.isfinite(value)):
            raise InvalidArgument(option, value, "expected a positive number of seconds",
                                  f"Pass e.g. {option} 600, or leave it out for the default.")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flashcheck", description=_DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    fuzz = sub.add_parser("fuzz", help="run a fuzzing campaign against a kernel", epilog=_FUZZ_EPILOG)
    fuzz.add_argument("kernel", help="torch:math, torch:flash, ..., flashcheck:triton, or package.module:function")
    fuzz.add_argument("--dtype", action="append", choices=DTYPES, help="repeat for several (default: the preset's)")
    fuzz.add_argument("--device", choices=DEVICES, default=None, help=_DEVICE_HELP)
    fuzz.add_argument("--max-examples", type=int, default=None, metavar="N",
                      help="cases to draw, at least 1 (default: the preset's)")
    fuzz.add_argument("--time-budget", type=float, default=None, metavar="S",
                      help="stop after S seconds (default: the preset's)")
    fuzz.add_argument("--seed", type=int, default=None, metavar="S",
                      help="fixes the drawn cases: the same seed and options give the same cases")
    fuzz.add_argument("--preset", default="smoke", metavar="NAME|PATH",
                      help="a built-in preset (flashcheck presets) or a TOML file (default: smoke)")
    fuzz.add_argument("--corpus", default="flashcheck-corpus", metavar="DIR",
                      help="where failing cases are saved (and the hypothesis database, unless --database)")
    fuzz.add_argument("--database", default=None, metavar="DIR|redis://HOST:PORT[/DB]",
                      help="a hypothesis example database to share: a directory, or a Redis server that campaigns "
                           "on several machines share (needs pip install 'flashcheck[redis]')")
    fuzz.add_argument("--json", default=None, metavar="PATH",
                      help="write the JSON summary here (also when the campaign is interrupted)")
    fuzz.add_argument("--no-progress", action="store_true", help="no progress bar")
    fuzz.add_argument("--keep-going", action="store_true",
                      help="go on past the first bug: shrink and save each distinct bug once, count the others")
    fuzz.add_argument("--case-timeout", type=float, default=None, metavar="S",
                      help="seconds one case may take before the kernel counts as hung and its worker process is "
                           "killed (default: 300 with --device cuda, 600 with --device cpu, the Triton interpreter)")
    fuzz.add_argument("--no-isolation", action="store_true",
                      help="run the kernel in this process: faster to start, easier to debug, but a crash or a "
                           "hang of the kernel ends the campaign, and there is no --case-timeout or --jobs")
    fuzz.add_argument("--jobs", type=int, default=None, metavar="N",
                      help="N worker processes, each with its own seed (derived from --seed), sharing the corpus "
                           "and the example database, spread over the visible GPUs; one merged summary "
                           "(default: the preset's, else 1)")

    fuzz.add_argument("--backward", action="store_true",
                      help="check the backward pass: dQ, dK, dV through autograd, for a dO regime drawn with "
                           "each case (the kernel's spec must declare backward=True)")

    replay = sub.add_parser("replay", help="re-run one saved case (a backward case re-runs the backward pass)")
    replay.add_argument("case", help="a saved case (.json, .npz or their common stem)")
    replay.add_argument("--kernel", default=None, help="another kernel than the one that produced the case")
    replay.add_argument("--device", choices=DEVICES, default=None, help=_DEVICE_HELP)
    replay.add_argument("--json", default=None, metavar="PATH", help="write the verdict here as JSON")

    selftest = sub.add_parser("selftest", help="the mutation suite: planted bugs against flashcheck and two anchor rules")
    selftest.add_argument("--device", choices=DEVICES, default=None, help=_DEVICE_HELP)
    selftest.add_argument("--dtype", action="append", choices=DTYPES, help="default: fp16 and fp32 on the CPU, all on a GPU")
    selftest.add_argument("--cases", type=int, default=200, metavar="N", help="cases per correct variant and dtype")
    selftest.add_argument("--bug-cases", type=int, default=60, metavar="N", help="at most this many cases per planted bug and dtype")
    selftest.add_argument("--max-n", type=int, default=160, metavar="N", help="longest sequence drawn")
    selftest.add_argument("--seed", type=int, default=0, metavar="S", help="fixes the case lists (default 0)")
    selftest.add_argument("--variant", action="append", default=None,
                          help="only these variants, e.g. torch:math or a planted bug's name (repeatable)")
    selftest.add_argument("--variants", choices=("all", "correct", "bugs"), default="all",
                          help="which half to run: the planted bugs, the correct kernels, or both (default)")
    selftest.add_argument("--backward", action="store_true",
                          help="the backward pass: planted backward bugs, correct kernels' dQ, dK, dV, the anchors' "
                               "backward rules")
    selftest.add_argument("--head-dims", default=None, metavar="D,D,...",
                          help="draw only these head dims (fewer Triton compilations on a GPU)")
    selftest.add_argument("--time-budget", type=float, default=None, metavar="S",
                          help="seconds; rows still running then stop early and are marked stopped")
    selftest.add_argument("--json", default=None, metavar="PATH",
                          help="the rows as JSON, rewritten after each row so a stopped run keeps what it finished")
    selftest.add_argument("--jobs", type=int, default=1, metavar="N",
                          help="run the rows (variant x dtype) in N processes, spread over the visible GPUs, "
                               "in chunks of their cases handed out round-robin (see --chunk)")
    selftest.add_argument("--chunk", type=int, default=None, metavar="K",
                          help="with --jobs: cases per chunk of a row (default 50; a planted bug's first chunk "
                               "holds at most 12, its later ones run only while it is not caught); the rows "
                               "are the same whatever --jobs and --chunk are")
    selftest.add_argument("--table", nargs="+", default=None, metavar="JSON",
                          help="run nothing: print one table from the --json files of earlier (e.g. sharded) runs")

    signoff = sub.add_parser("signoff", help="keep-going campaigns over kernels, then a report to file",
                             epilog="exit status: 0 SIGNED-OFF, 1 BLOCKED, 2 usage error, 3 no case judged")
    signoff.add_argument("kernels", nargs="+", metavar="KERNEL", help="kernels to sign off, e.g. torch:math torch:flash")
    signoff.add_argument("--out", required=True, metavar="DIR",
                         help="report.json, report.md, index.html, plots/, campaigns/ and corpus/ go here")
    signoff.add_argument("--backward", action="store_true",
                         help="also the backward pass of each kernel whose spec declares one")
    signoff.add_argument("--preset", default="signoff", metavar="NAME|PATH",
                         help="a built-in preset (flashcheck presets) or a TOML file (default: signoff)")
    signoff.add_argument("--jobs", type=int, default=None, metavar="N",
                         help="worker processes per campaign, spread over the visible GPUs (default: the preset's)")
    signoff.add_argument("--dtype", action="append", choices=DTYPES, help="repeat for several (default: the preset's)")
    signoff.add_argument("--device", choices=DEVICES, default=None, help=_DEVICE_HELP)
    signoff.add_argument("--max-examples", type=int, default=None, metavar="N", help="cases per campaign")
    signoff.add_argument("--time-budget", type=float, default=None, metavar="S",
                         help="seconds for the whole sign-off, shared by its campaigns (default: the preset's)")
    signoff.add_argument("--seed", type=int, default=None, metavar="S", help="fixes every campaign's cases")
    signoff.add_argument("--min-cases", type=int, default=100, metavar="N",
                         help="judged cases a kernel, pass and dtype needs to be signed off (default 100)")

    report = sub.add_parser("report", help="re-render a sign-off report, or compare several side by side")
    report.add_argument("reports", nargs="+", metavar="DIR", help="folders written by flashcheck signoff --out")
    report.add_argument("--out", default=None, metavar="DIR",
                        help="where to write (one report: default its own folder; several: required)")

    merge = sub.add_parser("merge", help="merge the --json summaries of campaigns run side by side into one")
    merge.add_argument("summaries", nargs="+", metavar="SUMMARY", help="JSON summaries written by fuzz --json")
    merge.add_argument("--json", default=None, metavar="PATH", help="write the merged summary here")

    sub.add_parser("kernels", help="list the built-in kernels")
    sub.add_parser("presets", help="list the built-in campaign presets")
    return parser


def _device(choice: str | None) -> str:
    if choice is not None:
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _prepare_device(argv) -> None:
    # The Triton interpreter is chosen when triton is imported: decide before anything imports it.
    if "--device" in argv and argv[argv.index("--device") + 1:][:1] == ["cpu"]:
        os.environ["TRITON_INTERPRET"] = "1"
    elif "--device=cpu" in argv:
        os.environ["TRITON_INTERPRET"] = "1"


def _progress_printer(total: int, enabled: bool):
    if not enabled:
        return None, None
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]fuzz"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TextColumn("{task.fields[found]}"), TimeElapsedColumn(), transient=False)
    task = bar.add_task("fuzz", total=total, rate="", found="")

    def update(result):
        import time as _t

        elapsed = max(_t.monotonic() - update.start, 1e-9)
        bugs = result.by_status.get("BUG", 0)
        bar.update(task, completed=min(result.examples, total), rate=f"{result.cases / elapsed:.1f} cases/s",
                   found=f"findings {len(result.findings) or bugs}")

    import time as _t

    update.start = _t.monotonic()
    return bar, update


def _exit_status(verdict: str) -> int:
    return {"BUG": EXIT_BUG, "NO_CASES": EXIT_NO_CASES}.get(verdict, EXIT_OK)


def _jobs(args, preset) -> int:
    from ..errors import InvalidArgument

    if args.jobs is None:  # the preset's, unless the kernel must run in this process
        return 1 if args.no_isolation else preset.jobs
    if args.jobs > 1 and args.no_isolation:
        raise InvalidArgument("--jobs", args.jobs, "worker processes run the kernel by name in processes of their "
                              "own, and --no-isolation runs it in this one", "Drop --no-isolation, or --jobs.")
    return args.jobs


def _cmd_fuzz(args) -> int:
    from ..errors import InvalidArgument
    from ..files import check_writable_file, check_writable_folder
    from ..inputs.presets import load_preset

    if args.case_timeout is not None and args.no_isolation:
        raise InvalidArgument("--case-timeout", args.case_timeout, "only a worker process can be stopped when "
                              "a case hangs, and --no-isolation runs the kernel in this process",
                              "Drop --no-isolation, or drop --case-timeout.")
    check_writable_file("--json", args.json)  # before any case runs: a result is never lost at the end
    check_writable_folder("--corpus", args.corpus)
    preset = load_preset(args.preset)
    jobs = _jobs(args, preset)
    # The kernel's worker starts now, before this process imports torch: the two imports overlap.
    from ..campaign.worker import WorkerProcess

    worker_process = WorkerProcess() if jobs == 1 and not args.no_isolation else None
    try:
        device = _device(args.device)
        _importable_from_cwd([args.kernel])
        total = args.max_examples or preset.max_examples
        bar, update = _progress_printer(total, not args.no_progress and sys.stderr.isatty())
        try:
            summary = _run_fuzz(args, device, preset, jobs, _started(bar, update), worker_process)
        finally:
            if bar is not None:
                bar.stop()
    finally:
        if worker_process is not None:
            worker_process.close()  # nothing to do once the campaign took it over
    _print_summary(summary)  # first: a summary that cannot be written is still seen
    return _write_json_or_usage(args.json, summary) or _exit_status(summary["verdict"])


def _write_json_or_usage(path: str | None, data) -> int:
    """Write ``--json``; a failure (the disk filled, the folder went away) is an error message and exit 2."""
    from ..judge.verdict import write_json

    if path is None:
        return EXIT_OK
    try:
        write_json(path, data)
    except OSError as exc:
        print(f"flashcheck: error: --json={path}: cannot be written ({exc}); the summary above is the result.",
              file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _importable_from_cwd(kernels: list[str]) -> None:
    # An import path resolves like `python -m`: from the current directory too (here and in the workers).
    if any(":" in k and k.split(":", 1)[0] not in ("torch", "flashcheck") for k in kernels):
        from ..kernels.origin import importable_from

        importable_from([os.getcwd()])


def _run_fuzz(args, device: str, preset, jobs: int, progress, worker_process=None) -> dict:
    """The campaign's summary: one process's, or the merged one of ``jobs`` worker processes."""
    options = dict(device=device, preset=preset, dtypes=args.dtype, max_examples=args.max_examples,
                   time_budget=args.time_budget, seed=args.seed, corpus=args.corpus, database=args.database,
                   keep_going=args.keep_going, case_timeout=args.case_timeout, progress=progress,
                   started_at=args.started_at, backward=args.backward)
    if jobs > 1:
        from ..campaign.parallel import run_campaigns

        return run_campaigns(args.kernel, jobs=jobs, **options)
    from ..campaign.run import run_campaign

    return run_campaign(args.kernel, isolate=not args.no_isolation, worker_process=worker_process,
                        **options).as_dict()


def _started(bar, update):
    # The bar starts with the first case: the worker process loads the kernel first, and a kernel that
    # cannot load is reported as a usage error without a bar around it.
    if bar is None:
        return None

    def progress(result):
        if not progress.started:
            import time

            progress.started = True
            update.start = time.monotonic()
            bar.start()
        update(result)

    progress.started = False
    return progress


def _text(value) -> str:
    # A value that merged campaigns share, or their different values.
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def _print_summary(d: dict) -> None:
    """A campaign's summary (``CampaignResult.as_dict()``, or the merged one of ``--jobs``), for people."""
    print(f"flashcheck fuzz {_text(d['kernel'])} on {_text(d['device'])} (preset {_text(d['preset'])}): {d['verdict']}")
    first = f", first judged case {_text(d['first_case_s'])} s after start" if d.get("first_case_s") is not None else ""
    print(f"  {d['cases']} cases in {d['elapsed_s']} s ({d['cases_per_s']} cases/s){first}, "
          f"stopped: {_text(d['stopped'])}")
    if d["cases"] != d["examples"]:
        print(f"  {d['examples']} cases drawn, {d['cases'] - d['examples']} tried while shrinking")
    print(f"  time: {_time_split(d['time_split_s'], d.get('compilations', 0))}")
    isolation = _text(d["isolation"])
    if isolation == "worker":
        isolation += (f" process, case timeout {_text(d['case_timeout_s'])} s, {d['worker_restarts']} restarts, "
                      f"{d['timeouts']} timeouts")
    print(f"  kernel ran: {isolation}")
    for source in d.get("sources") or []:  # one per --jobs worker
        gpu = f" (GPU {source['gpu']})" if source.get("gpu") is not None else ""
        ended = f", ended: {source['exit']}" if source.get("exit") else ""
        print(f"  {source['source']}{gpu}: {source['verdict']}, {source['cases']} cases, {source['findings']} "
              f"findings, stopped: {source.get('stopped')}{ended}")
    info = d["info"]
    if info.get("batch_checked"):
        print(f"  batch invariance (information): {info['batch_dependent']} of {info['batch_checked']} "
              "batched cases gave other bits for a sequence run alone")
    _print_skipped(d)
    for dtype, ratio in sorted(d["max_ratio_by_dtype"].items()):
        print(f"  {dtype}: {d['counts']['by_dtype'].get(dtype, 0)} cases, max error/budget {float(ratio):.3g}")
    _print_bugs(d.get("bugs") or [])
    for note in d["notes"]:
        print(f"  note: {note}")
    if d["findings"]:
        print(f"  raw findings ({len(d['findings'])}, each saved case):")
    for f in d["findings"]:
        state = "as found" if not f["shrunk"] else "shrunk" if f.get("shrink_complete", True) else "partly shrunk"
        source = f", {f['source']}" if "source" in f else ""
        print(f"  {f['status']} {'+'.join(f['kinds'])} ({state}{source}): {f['case']}")
        for line in f["diagnosis"]:
            print(f"      {line}")
        print(f"      replay: {f['replay']}")


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _print_bugs(bugs: list) -> None:
    """The distinct bugs, first: what a reader acts on (one per root cause, with its smallest case)."""
    if not bugs:
        return
    print(f"  distinct bugs: {len(bugs)}")
    for bug in bugs:
        print(f"  #{bug['id']} {bug['status']} [{bug['cause']}] {bug['title']}")
        shrink = f" (+{bug['shrink_cases']} met while shrinking another)" if bug.get("shrink_cases") else ""
        print(f"      {bug['cases']} drawn cases{shrink}, max error/budget {_text(bug['max_ratio'])}; dtypes: "
              f"{_counts(bug['dtypes'])}; layouts: {_counts(bug['layouts'])}; causal: {_counts(bug['causal'])}; "
              f"where: {_counts(bug.get('parts') or {})}")
        print(f"      regimes: {_counts(bug['regimes'])}")
        smallest = bug.get("smallest")
        if smallest:
            state = "shrunk" if smallest["shrunk"] else "as found"
            print(f"      smallest case ({state}): {smallest['case']}")
            for line in bug["diagnosis"]:
                print(f"        {line}")
            print(f"      replay: {smallest['replay']}")


def _time_split(split: dict, compilations: int) -> str:
    # Compilation time is part of the kernel's: shown inside it, not beside it.
    parts = []
    for part, seconds in split.items():
        if part == "kernel" and (compilations or split.get("compile")):
            parts.append(f"kernel {seconds:.2f} s (compiling {split.get('compile', 0.0):.2f} s of it, "
                         f"{compilations} compilations)")
        elif part != "compile":
            parts.append(f"{part} {seconds:.2f} s")
    return ", ".join(parts)


def _print_skipped(d: dict) -> None:
    skipped = sum(d["skipped"].values())
    if not skipped:
        return
    why = ", ".join(f"{n} {'out of memory' if k == 'oom' else k}" for k, n in d["skipped"].items() if n)
    print(f"  skipped (not judged): {skipped} cases ({why})")
    for reason, n in sorted((d.get("skipped_reasons") or {}).items(), key=lambda kv: -kv[1]):
        print(f"      {n} x {reason}")


def _cmd_replay(args) -> int:
    from ..files import check_writable_file
    from ..inputs.case import AttentionCase
    from ..judge.backward import check_backward, is_backward_case
    from ..judge.check import check

    check_writable_file("--json", args.json)
    case = AttentionCase.load(args.case)
    device = _device(args.device)
    kernel = _replay_kernel(case.provenance or {}, args.kernel, device)
    if is_backward_case(case):  # its provenance names the dO regime and seed it failed with
        verdict = check_backward(kernel, case, device=device)
    else:
        verdict = check(kernel, case, device=device)
    print(verdict)
    return _write_json_or_usage(args.json, verdict.as_dict()) or (EXIT_BUG if verdict.status == "BUG" else EXIT_OK)


def _replay_kernel(provenance: dict, override: str | None, device: str):
    """The kernel a saved case replays on: ``--kernel``, else the one it was found with, reached as the
    user named it (import path or built-in name with options), whatever its display name is."""
    from ..errors import InvalidArgument
    from ..kernels.origin import importable_from
    from ..kernels.registry import resolve_kernel

    shown, source = provenance.get("kernel"), provenance.get("kernel_source")
    name = override or source or shown
    if not name:
        raise InvalidArgument("--kernel", name, "the saved case does not name its kernel",
                              "Pass --kernel NAME to choose the kernel to replay it on.")
    importable_from([os.getcwd(), provenance.get("kernel_import_root")])
    try:
        kernel = resolve_kernel(name, device=device)
    except InvalidArgument as exc:
        if override:
            raise
        why = "the case was saved before cases recorded their kernel's import path, and its kernel's display " \
            "name" if not source else "the kernel the case was found with"
        raise InvalidArgument("--kernel", name, f"{why} {name!r} cannot be loaded here ({getattr(exc, 'problem', exc)})",
                              "Pass --kernel with the kernel's import path, as given to flashcheck fuzz "
                              "(e.g. --kernel mymodule:attention), from the folder it imports from.") from None
    if override and (source or shown):
        _note_dropped_options(source or shown, kernel.name)
    elif shown and shown != kernel.name:
        print(f"kernel {shown} (reached as {name})")
    return kernel


def _note_dropped_options(recorded: str, chosen: str) -> None:
    """Say so when ``--kernel`` names the case's kernel without the options it was found with."""
    from ..kernels.registry import parse_kernel_name

    (base, mutant, had), (base2, mutant2, has) = parse_kernel_name(recorded), parse_kernel_name(chosen)
    changed = [f"{k}={v}" for k, v in had.items() if has.get(k) != v]
    if (base, mutant) == (base2, mutant2) and changed:
        print(f"note: the case was found with {recorded}; --kernel runs {chosen}, without "
              f"{', '.join(changed)}. Pass --kernel '{recorded}' to replay it as found.")


def _int_list(option: str, text: str | None):
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        from ..errors import InvalidArgument

        raise InvalidArgument(option, text, "expected positive integers separated by commas", f"Pass e.g. {option} 64,128.")
    return values


def _selftest_exit(rows) -> int:
    if sum(r.cases for r in rows) == 0:  # nothing checked is not a pass
        print("flashcheck selftest: NO_CASES (no row ran a case)", file=sys.stderr)
        return EXIT_NO_CASES
    missed = [r for r in rows if not r.correct and not r.flashcheck.first_case and not r.stopped]
    alarms = [r for r in rows if r.correct and r.flashcheck.first_case]
    return EXIT_BUG if missed or alarms else EXIT_OK


def _check_variant_names(names, device: str, backward: bool) -> None:
    """``--variant`` names the self-test knows (on this device, for this pass), else a usage error."""
    from ..errors import InvalidArgument
    from ..selftest.run import variants

    known = [v.name for v in variants(device, backward=backward)]
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        other = {v.name for v in variants(device, backward=not backward)}
        misplaced = [n for n in unknown if n in other]
        hint = (f" {', '.join(misplaced)}: a variant of the {'forward' if backward else 'backward'} pass "
                f"({'drop' if backward else 'add'} --backward)." if misplaced else "")
        raise InvalidArgument("--variant", unknown[0], f"no such self-test variant on {device}"
                              + (" for the backward pass" if backward else ""), f"Use one of {known}.{hint}")


def _saved_rows(paths):
    from ..errors import InvalidArgument
    from ..selftest.run import Row

    rows = []
    for path in paths:
        try:
            saved = json.loads(Path(path).read_text())
            if not isinstance(saved, list) or not saved:
                raise ValueError("expected a non-empty list of rows")
            rows += [Row.from_dict(d) for d in saved]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument("--table", path, f"not a selftest --json file ({type(exc).__name__}: {exc})",
                                  "Pass files written by `flashcheck selftest --json PATH`.") from None
    return rows


def _cmd_selftest(args) -> int:
    from ..judge.verdict import write_json
    from ..selftest.run import format_table

    if args.table:
        rows = _saved_rows(args.table)
        print(format_table(rows))
        return _selftest_exit(rows)
    from ..files import check_writable_file

    check_writable_file("--json", args.json)
    device = _device(args.device)
    dtypes = args.dtype or (["fp16", "fp32"] if device == "cpu" else list(DTYPES))
    _check_variant_names(args.variant, device, args.backward)

    done = []

    def progress(row):
        done.append(row)
        if args.json:
            write_json(args.json, [r.as_dict() for r in done])
        state = ("ok" if row.flashcheck.first_case is None else "FALSE ALARM") if row.correct else \
            (f"BUG @{row.flashcheck.first_case}" if row.flashcheck.first_case else "STOPPED" if row.stopped else "MISSED")
        print(f"  {row.variant:28} {row.dtype}  {row.cases:4} cases  {state}  ({row.seconds:.1f} s)",
              file=sys.stderr, flush=True)

    rows = _run_selftest(args, device, dtypes, progress)
    if args.json:  # in the table's order (--jobs finishes rows in any order)
        write_json(args.json, [r.as_dict() for r in rows])
    print(format_table(rows))
    return _selftest_exit(rows)


def _cmd_merge(args) -> int:
    from ..campaign.merge import load_summary, merge_summaries
    from ..files import check_writable_file

    check_writable_file("--json", args.json)
    merged = merge_summaries([load_summary(p) for p in args.summaries], sources=args.summaries)
    print(f"flashcheck merge of {len(args.summaries)} summaries:")
    _print_summary(merged)
    return _write_json_or_usage(args.json, merged) or _exit_status(merged["verdict"])


def _run_selftest(args, device: str, dtypes, progress) -> list:
    """The self-test's rows, run here or (``--jobs N``) in N processes: the same rows either way."""
    from ..selftest.run import run_selftest, selftest_plan

    options = dict(cases=args.cases, bug_cases=args.bug_cases, seed=args.seed, max_n=args.max_n,
                   head_dims=_int_list("--head-dims", args.head_dims), backward=args.backward)
    if args.jobs == 1:
        return run_selftest(device=device, dtypes=dtypes, names=args.variant, which=args.variants,
                            time_budget=args.time_budget, progress=progress, **options)
    from ..campaign.parallel import run_selftest_rows

    plan = selftest_plan(device=device, dtypes=dtypes, names=args.variant, which=args.variants,
                         backward=args.backward)
    return run_selftest_rows(plan, jobs=args.jobs, device=device, time_budget=args.time_budget, progress=progress,
                             chunk=args.chunk, **options)


def _cmd_kernels(args) -> int:
    from ..kernels.registry import BUILTIN_KERNELS

    for name, text in BUILTIN_KERNELS.items():
        print(f"{name:20} {text}")
    return EXIT_OK


def _cmd_signoff(args) -> int:
    from ..report.commands import cmd_signoff

    _importable_from_cwd(args.kernels)
    return cmd_signoff(args, _device(args.device))


def _cmd_report(args) -> int:
    from ..report.commands import cmd_report

    return cmd_report(args)


def _cmd_presets(args) -> int:
    from ..inputs.presets import builtin_presets, load_preset

    for name in builtin_presets():
        print(f"{name:14} {load_preset(name).description}")
    return EXIT_OK


_COMMANDS = {"fuzz": _cmd_fuzz, "replay": _cmd_replay, "selftest": _cmd_selftest, "merge": _cmd_merge,
             "signoff": _cmd_signoff, "report": _cmd_report, "kernels": _cmd_kernels, "presets": _cmd_presets}
# Their campaigns take a Ctrl-C that came while they started up, and stop with a summary.
_CAMPAIGN_COMMANDS = ("fuzz", "signoff")


def main(argv=None) -> int:
    from ..campaign import interrupts
    from ..campaign.clock import process_start

    interrupts.defer()  # a Ctrl-C while torch loads is a request to stop, not a traceback
    started_at = process_start() if argv is None else time.monotonic()  # what first_case_s counts from
    argv = list(sys.argv[1:] if argv is None else argv)
    _prepare_device(argv)
    try:
        args = _parser().parse_args(argv)
        args.started_at = started_at
        args.argv = argv[1:]  # what follows the command's name, for a report to name the command it ran
        return _run_command(args)
    except KeyboardInterrupt:
        command = next((a for a in argv if a in _COMMANDS), "")
        print(f"flashcheck {command}: interrupted (Ctrl-C) before it had a result to report".replace("  ", " "),
              file=sys.stderr)
        return 130
    finally:
        interrupts.restore_quietly()


def _run_command(args) -> int:
    from ..campaign import interrupts
    from ..campaign.worker import quiet_interpreter
    from ..errors import FlashcheckError

    quiet_interpreter()
    if args.command not in _CAMPAIGN_COMMANDS:
        interrupts.restore()  # raises KeyboardInterrupt if one came meanwhile
    try:
        _check_counts(args)
        return _COMMANDS[args.command](args)
    except FlashcheckError as exc:
        print(f"flashcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
