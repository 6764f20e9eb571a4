"""``flashcheck fuzz``: a fuzzing campaign against one kernel.

The kernel runs in a worker process: a kernel that dies is a ``crash`` finding, one that runs past
``--case-timeout`` (default 300 s on a GPU, 600 s under the Triton interpreter) a ``timeout`` finding, and
the campaign goes on with a fresh worker; cases that run out of device memory, or that the kernel declines
(``flashcheck.Unsupported``), are skipped and counted. Ctrl-C or SIGTERM ends a campaign early with its
summary written and its corpus kept (exit 1 if a bug was found before, else 0). ``--jobs N`` runs the
campaign in N worker processes (spread over the visible GPUs) and writes one merged summary
(:mod:`flashcheck.campaign.parallel`).

Time to the first case: the kernel's worker process starts before this process imports torch (nothing in
``flashcheck.cli`` imports it at module level, nor does ``import flashcheck``), so the worker imports torch
and loads the kernel while this process imports its own and prepares the campaign; each ``--jobs`` worker
does the same. The summary's ``first_case_s`` is the seconds from the start of the ``flashcheck`` process
(from the call, when :func:`flashcheck.cli.main` is given ``argv``) to the end of the first judged case.
"""

from __future__ import annotations

import sys
import time

from .options import (
    add_backward,
    add_cluster,
    add_device,
    add_dtype,
    add_jobs,
    add_json,
    add_max_examples,
    add_preset,
    add_seed,
    add_time_budget,
    choose_device,
    exit_status,
    importable_from_cwd,
    write_json_or_usage,
)
from .summary import print_summary

__all__ = ["add_parser", "run"]

EPILOG = """exit status: 0 nothing wrong (PASS or SUSPICIOUS), 1 a bug was found (BUG), 2 usage error,
3 no case was judged (NO_CASES: every case skipped, e.g. out of memory or unsupported, or none run)"""


def add_parser(subparsers) -> None:
    fuzz = subparsers.add_parser("fuzz", help="run a fuzzing campaign against a kernel", epilog=EPILOG)
    fuzz.set_defaults(run=run)
    fuzz.add_argument("kernel", help="torch:math, torch:flash, ..., flashcheck:triton, or package.module:function")
    add_dtype(fuzz)
    add_device(fuzz)
    add_max_examples(fuzz, help="cases to draw, at least 1 (default: the preset's)")
    add_time_budget(fuzz, help="stop after S seconds (default: the preset's)")
    add_seed(fuzz, help="fixes the drawn cases: the same seed and options give the same cases")
    add_preset(fuzz, default="smoke")
    fuzz.add_argument("--corpus", default="flashcheck-corpus", metavar="DIR",
                      help="where failing cases are saved (and the hypothesis database, unless --database)")
    fuzz.add_argument("--database", default=None, metavar="DIR|redis://HOST:PORT[/DB]",
                      help="a hypothesis example database to share: a directory, or a Redis server that campaigns "
                           "on several machines share (needs pip install 'flashcheck[redis]')")
    add_json(fuzz, help="write the JSON summary here (also when the campaign is interrupted)")
    fuzz.add_argument("--no-progress", action="store_true", help="no progress bar")
    fuzz.add_argument("--keep-going", action="store_true",
                      help="go on past the first bug: shrink and save each distinct bug once, count the others")
    fuzz.add_argument("--case-timeout", type=float, default=None, metavar="S",
                      help="seconds one case may take before the kernel counts as hung and its worker process is "
                           "killed (default: 300 with --device cuda, 600 with --device cpu, the Triton interpreter)")
    fuzz.add_argument("--no-isolation", action="store_true",
                      help="run the kernel in this process: faster to start, easier to debug, but a crash or a "
                           "hang of the kernel ends the campaign, and there is no --case-timeout or --jobs")
    add_jobs(fuzz, help="N worker processes, each with its own seed (derived from --seed), sharing the corpus "
                        "and the example database, spread over the visible GPUs; one merged summary "
                        "(default: the preset's, else 1)")
    add_backward(fuzz, help="check the backward pass: dQ, dK, dV through autograd, for a dO regime drawn with "
                            "each case (the kernel's spec must declare backward=True)")
    add_cluster(fuzz, help="run the --jobs workers on a Ray cluster's nodes; the corpus and the example database "
                           "must be reachable from every node")


def run(args) -> int:
    """The campaign, its summary printed and written; the exit status of its verdict."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..files import check_writable_file, check_writable_folder
    from ..inputs.drawing import draw_place
    from ..inputs.presets import load_preset

    if args.case_timeout is not None and args.no_isolation:
        raise InvalidArgument("--case-timeout", args.case_timeout, "only a worker process can be stopped when "
                              "a case hangs, and --no-isolation runs the kernel in this process",
                              "Drop --no-isolation, or drop --case-timeout.")
    draw_place()  # an unknown FLASHCHECK_DRAW, before anything runs
    check_writable_file("--json", args.json)  # before any case runs: a result is never lost at the end
    check_writable_folder("--corpus", args.corpus)
    preset = load_preset(args.preset)
    jobs = _jobs(args, preset)
    from ..campaign.ray_transport import check_cluster  # on first use: every command module loads at start-up

    cluster = check_cluster(args.cluster)
    if cluster is not None and args.no_isolation:
        raise InvalidArgument("--cluster", args.cluster, "the cluster's workers run the kernel in processes of their "
                              "own, and --no-isolation runs it in this one", "Drop --no-isolation, or --cluster.")
    # The kernel's worker starts now, before this process imports torch: the two imports overlap.
    from ..campaign.worker import WorkerProcess

    worker_process = WorkerProcess() if jobs == 1 and cluster is None and not args.no_isolation else None
    try:
        config = _campaign_config(args, choose_device(args.device), preset)
        importable_from_cwd([args.kernel])
        bar, update = _progress_printer(config.max_examples, not args.no_progress and sys.stderr.isatty())
        try:
            summary = _run_fuzz(config, jobs, _started(bar, update), worker_process, cluster).as_dict()
        finally:
            if bar is not None:
                bar.stop()
    finally:
        if worker_process is not None:
            worker_process.close()  # nothing to do once the campaign took it over
    print_summary(summary, args.json)  # first: a summary that cannot be written is still seen
    return write_json_or_usage(args.json, summary) or exit_status(summary["verdict"])


def _jobs(args, preset) -> int:
    from ..errors import InvalidArgument  # on first use: every command module loads at start-up

    if args.jobs is None:  # the preset's, unless the kernel must run in this process
        return 1 if args.no_isolation else preset.jobs
    if args.jobs > 1 and args.no_isolation:
        raise InvalidArgument("--jobs", args.jobs, "worker processes run the kernel by name in processes of their "
                              "own, and --no-isolation runs it in this one", "Drop --no-isolation, or --jobs.")
    return args.jobs


def _campaign_config(args, device: str, preset):
    """The :class:`~flashcheck.campaign.config.CampaignConfig` the options ask for."""
    # imported once the kernel's worker process has started: what comes before delays the first case
    from ..campaign.config import CampaignConfig, Drawing, Execution, Limits, Storage, Target

    return CampaignConfig(
        Target(args.kernel, device, preset, None if args.dtype is None else tuple(args.dtype), backward=args.backward),
        limits=Limits(args.max_examples, args.time_budget, keep_going=args.keep_going),
        drawing=Drawing(seed=args.seed), storage=Storage(args.corpus, args.database),
        execution=Execution(isolate=not args.no_isolation, case_timeout=args.case_timeout),
        started_at=args.started_at)


def _run_fuzz(config, jobs: int, progress, worker_process=None, cluster: str | None = None):
    """The campaign's :class:`~flashcheck.campaign.summary.CampaignSummary`: one process's, or the combined
    one of ``jobs`` worker processes (on this host, or on a Ray ``cluster``'s nodes)."""
    if jobs > 1 or cluster is not None:
        from ..campaign.parallel import run_campaigns  # once the workers' config is known

        return run_campaigns(config, jobs=jobs, progress=progress, cluster=cluster)
    # torch and hypothesis: imported while the kernel's worker process imports its own
    from ..campaign.config import CampaignHooks
    from ..campaign.run import run_campaign

    return run_campaign(config, CampaignHooks(progress=progress, worker_process=worker_process)).summary()


def _progress_printer(total: int, enabled: bool):
    if not enabled:
        return None, None
    from rich.progress import (  # only for a terminal: without one, rich is never imported
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(TextColumn("[bold]fuzz"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                   TextColumn("{task.fields[found]}"), TimeElapsedColumn(), transient=False)
    task = bar.add_task("fuzz", total=total, rate="", found="")

    def update(result):
        elapsed = max(time.monotonic() - update.start, 1e-9)
        bugs = result.by_status.get("BUG", 0)
        bar.update(task, completed=min(result.examples, total), rate=f"{result.cases / elapsed:.1f} cases/s",
                   found=f"findings {len(result.findings) or bugs}")

    update.start = time.monotonic()
    return bar, update


def _started(bar, update):
    # The bar starts with the first case: the worker process loads the kernel first, and a kernel that
    # cannot load is reported as a usage error without a bar around it.
    if bar is None:
        return None

    def progress(result):
        if not progress.started:
            progress.started = True
            update.start = time.monotonic()
            bar.start()
        update(result)

    progress.started = False
    return progress
