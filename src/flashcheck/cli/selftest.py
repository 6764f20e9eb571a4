"""``flashcheck selftest``: the mutation suite, planted bugs against flashcheck and two anchor rules.
``--jobs N`` runs its rows in N processes (the same rows either way); ``--table`` prints the rows of
earlier runs without running anything.

Exit status: 1 when a planted bug was missed or a correct kernel raised a false alarm, 3 when no row ran a
case (nothing checked is not a pass), else 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..contract.formats import DTYPES
from .options import (
    DESTS,
    EXIT_BUG,
    EXIT_NO_CASES,
    EXIT_OK,
    add_backward,
    add_cluster,
    add_device,
    add_dtype,
    add_jobs,
    add_json,
    add_seed,
    add_time_budget,
    choose_device,
)

__all__ = ["add_parser", "run"]

# The option that sizes the parts a row's cases are cut into under --jobs (a name users know, kept).
PART_OPTION = "--chunk"


def add_parser(subparsers) -> None:
    selftest = subparsers.add_parser("selftest",
                                     help="the mutation suite: planted bugs against flashcheck and two anchor rules")
    selftest.set_defaults(run=run)
    add_device(selftest)
    add_dtype(selftest, help="default: fp16 and fp32 on the CPU, all on a GPU")
    selftest.add_argument("--cases", type=int, default=200, metavar="N", help="cases per correct variant and dtype")
    selftest.add_argument("--bug-cases", type=int, default=60, metavar="N",
                          help="at most this many cases per planted bug and dtype, whatever --cases is (a planted "
                               "bug's row ends once every detector caught it)")
    selftest.add_argument("--max-n", type=int, default=160, metavar="N", help="longest sequence drawn")
    add_seed(selftest, help="fixes the case lists (default 0)", default=0)
    selftest.add_argument("--variant", action="append", default=None,
                          help="only these variants, e.g. torch:math or a planted bug's name (repeatable)")
    selftest.add_argument("--variants", choices=("all", "correct", "bugs"), default="all",
                          help="which half to run: the planted bugs, the correct kernels, or both (default)")
    add_backward(selftest, help="the backward pass: planted backward bugs, correct kernels' dQ, dK, dV, the "
                                "anchors' backward rules")
    selftest.add_argument("--head-dims", default=None, metavar="D,D,...",
                          help="draw only these head dims (fewer Triton compilations on a GPU)")
    add_time_budget(selftest, help="seconds; rows still running then stop early and are marked stopped")
    add_json(selftest, help="the rows as JSON, rewritten after each row so a stopped run keeps what it finished")
    add_jobs(selftest, default=1, help="run the rows (variant x dtype) in N processes, spread over the visible "
                                       f"GPUs, in parts of their cases handed out round-robin (see {PART_OPTION})")
    add_cluster(selftest, help="run the --jobs processes on a Ray cluster's nodes (a --corpus must be a folder "
                               "every node reaches)")
    selftest.add_argument(PART_OPTION, dest=DESTS[PART_OPTION], type=int, default=None, metavar="K",
                          help="with --jobs: cases per part of a row (default 50; a planted bug's first part "
                               "holds at most 12, its later ones run only while it is not caught); the rows "
                               f"are the same whatever --jobs and {PART_OPTION} are")
    selftest.add_argument("--corpus", default=None, metavar="DIR",
                          help="save each case a correct kernel failed (BUG or SUSPICIOUS) here as it is found, "
                               "to replay with `flashcheck replay`")
    selftest.add_argument("--table", nargs="+", default=None, metavar="JSON",
                          help="run nothing: print one table from the --json files of earlier (e.g. sharded) runs")


def run(args) -> int:
    """The rows, each reported as it ends and all in one table at the end; or (``--table``) saved rows."""
    # on first use: every command module loads at start-up
    from ..campaign.ray_transport import check_cluster
    from ..files import check_writable_folder, check_writable_file, write_json
    from ..selftest.table import format_table

    if args.table:
        rows = _saved_rows(args.table)
        print(format_table(rows))
        return _selftest_exit(rows)
    args.cluster = check_cluster(args.cluster)
    check_writable_file("--json", args.json)
    if args.corpus is not None:
        check_writable_folder("--corpus", args.corpus)
    device = choose_device(args.device)
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


def _run_selftest(args, device: str, dtypes, progress) -> list:
    """The self-test's rows, run here or (``--jobs N``) in N processes: the same rows either way."""
    # on first use (torch among them): every command module loads at start-up
    from ..selftest.config import SelftestConfig
    from ..selftest.parallel import run_selftest_rows
    from ..selftest.run import run_selftest

    head_dims = _int_list("--head-dims", args.head_dims)
    config = SelftestConfig(device, tuple(dtypes), names=None if args.variant is None else tuple(args.variant),
                            which=args.variants, backward=args.backward, cases=args.cases, bug_cases=args.bug_cases,
                            seed=args.seed, max_n=args.max_n, head_dims=None if head_dims is None else tuple(head_dims),
                            time_budget=args.time_budget, corpus=args.corpus)
    if args.jobs == 1 and args.cluster is None:
        return run_selftest(config, progress)
    return run_selftest_rows(config, jobs=args.jobs, part_cases=args.part_cases, progress=progress,
                             cluster=args.cluster)


def _int_list(option: str, text: str | None):
    """``--head-dims 64,128`` as a list of positive integers (None when not given)."""
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        # on first use: every command module loads at start-up
        from ..errors import InvalidArgument

        raise InvalidArgument(option, text, "expected positive integers separated by commas", f"Pass e.g. {option} 64,128.")
    return values


def _selftest_exit(rows) -> int:
    """1 for a missed planted bug, a false alarm or a case flashcheck failed on, 3 when no row ran a case, else 0."""
    if sum(r.cases for r in rows) == 0:  # nothing checked is not a pass
        print("flashcheck selftest: NO_CASES (no row ran a case)", file=sys.stderr)
        return EXIT_NO_CASES
    missed = [r for r in rows if not r.correct and not r.flashcheck.first_case and not r.stopped]
    alarms = [r for r in rows if r.correct and r.flashcheck.first_case]
    errors = sum(r.errors for r in rows)
    if errors:
        print(f"flashcheck selftest: {errors} cases raised inside flashcheck (tracebacks above)", file=sys.stderr)
    return EXIT_BUG if missed or alarms or errors else EXIT_OK


def _check_variant_names(names, device: str, backward: bool) -> None:
    """``--variant`` names the self-test knows (on this device, for this pass), else a usage error."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..selftest.subjects import subjects

    known = [s.name for s in subjects(device, backward=backward)]
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        other = {s.name for s in subjects(device, backward=not backward)}
        misplaced = [n for n in unknown if n in other]
        hint = (f" {', '.join(misplaced)}: a variant of the {'forward' if backward else 'backward'} pass "
                f"({'drop' if backward else 'add'} --backward)." if misplaced else "")
        raise InvalidArgument("--variant", unknown[0], f"no such self-test variant on {device}"
                              + (" for the backward pass" if backward else ""), f"Use one of {known}.{hint}")


def _saved_rows(paths):
    """The rows of earlier runs' ``--json`` files, for ``--table``; a file that holds none is a usage error."""
    # on first use: every command module loads at start-up
    from ..errors import InvalidArgument
    from ..selftest.rows import Row

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

