"""What the ``flashcheck`` commands share: the exit codes and the rule from a verdict to one, the options
that several commands add (built here, so each is spelled, typed and documented the same way), the device
choice, the check of every count and duration before anything runs, and the ``--json`` writer.

Nothing here imports torch: the device choice imports it only when no ``--device`` was given.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..contract.counts import check_count, check_seconds
from ..contract.formats import ALL_DTYPES, DEVICES
from ..files import write_json
from ..kernels.origin import importable_from, reserved

__all__ = ["DESTS", "EXIT_BUG", "EXIT_NO_CASES", "EXIT_OK", "EXIT_USAGE", "add_backward", "add_cluster", "add_device",
           "add_dtype",
           "add_jobs", "add_json", "add_max_examples", "add_preset", "add_seed", "add_time_budget", "check_options",
           "choose_device", "exit_status", "importable_from_cwd", "prepare_device", "whole_number",
           "write_json_or_usage"]

EXIT_OK, EXIT_BUG, EXIT_USAGE, EXIT_NO_CASES = 0, 1, 2, 3

DEVICE_HELP = "cpu runs Triton kernels under the Triton interpreter (default: cuda if available)"
PRESET_DTYPES_HELP = "repeat for several (default: the preset's)"

# Count and duration options: 0 or less would check nothing (or mean "the default" by accident). The order
# is the order they are checked in: the first bad one is the one reported.
COUNTS = {"--max-examples": "cases", "--jobs": "worker processes", "--cases": "cases", "--bug-cases": "cases",
          "--max-n": "keys", "--chunk": "cases", "--min-cases": "judged cases", "--min-regime-cases": "judged cases"}
DURATIONS = ("--time-budget", "--case-timeout")
# Options whose value argparse keeps under another name (``dest``) than the option's own.
DESTS = {"--chunk": "part_cases"}


def whole_number(text: str) -> int:
    """A count option's argparse type: what a non-integer gets is how to write one (the range is
    :func:`check_options`'s)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: pass e.g. 10") from None


def exit_status(verdict: str) -> int:
    """A campaign's exit status: a bug is 1, no judged case 3 (never a pass), anything else 0."""
    return {"BUG": EXIT_BUG, "NO_CASES": EXIT_NO_CASES}.get(verdict, EXIT_OK)


def check_options(args) -> None:
    """Every count option a whole number >= 1 and every duration positive, before anything runs."""
    for option in (*COUNTS, *DURATIONS):
        value = getattr(args, DESTS.get(option, option[2:].replace("-", "_")), None)
        if value is None:
            continue
        fix = f"Pass e.g. {option} {4 if option in COUNTS else 600}, or leave it out for the default."
        if option in COUNTS:
            check_count(option, value, what=f"a number of {COUNTS[option]}", fix=fix)
        else:
            check_seconds(option, value, fix=fix)


def prepare_device(argv) -> None:
    """``--device cpu`` runs Triton kernels under the interpreter, which is chosen when triton is imported:
    decide before anything imports it."""
    if "--device" in argv and argv[argv.index("--device") + 1:][:1] == ["cpu"]:
        os.environ["TRITON_INTERPRET"] = "1"
    elif "--device=cpu" in argv:
        os.environ["TRITON_INTERPRET"] = "1"


def choose_device(choice: str | None) -> str:
    """``--device``, else cuda when torch sees a GPU (torch is imported only then)."""
    if choice is not None:
        return choice
    import torch  # lazy: a command imports torch after its kernel's worker started, and only when it must

    return "cuda" if torch.cuda.is_available() else "cpu"


def importable_from_cwd(kernels: list[str]) -> None:
    """An import path resolves like ``python -m``: from the current directory too (here and in the workers)."""
    if any(":" in k and not reserved(k) for k in kernels):
        importable_from([os.getcwd()])


def write_json_or_usage(path: str | None, data) -> int:
    """Write ``--json``; a failure (the disk filled, the folder went away) is an error message and exit 2."""
    if path is None:
        return EXIT_OK
    try:
        write_json(path, data)
    except OSError as exc:
        print(f"flashcheck: error: --json={path}: cannot be written ({exc}); the summary above is the result.",
              file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


# ---- options that more than one command adds: the same name, type and metavar; each command's own help ----

def add_device(parser) -> None:
    parser.add_argument("--device", choices=DEVICES, default=None, help=DEVICE_HELP)


def add_dtype(parser, help: str = PRESET_DTYPES_HELP) -> None:
    parser.add_argument("--dtype", action="append", choices=ALL_DTYPES, help=help)


def add_preset(parser, default: str) -> None:
    parser.add_argument("--preset", default=default, metavar="NAME|PATH",
                        help=f"a built-in preset (flashcheck presets) or a TOML file (default: {default})")


def add_max_examples(parser, help: str) -> None:
    parser.add_argument("--max-examples", type=int, default=None, metavar="N", help=help)


def add_time_budget(parser, help: str) -> None:
    parser.add_argument("--time-budget", type=float, default=None, metavar="S", help=help)


def add_seed(parser, help: str, default: int | None = None) -> None:
    parser.add_argument("--seed", type=int, default=default, metavar="S", help=help)


def add_jobs(parser, help: str, default: int | None = None) -> None:
    parser.add_argument("--jobs", type=int, default=default, metavar="N", help=help)


CLUSTER_HELP = ("ray: this host's cluster, or a new local one; HOST:PORT: the cluster whose head listens there (as "
                "`ray start --address` takes it); ray://HOST:PORT: through Ray Client. Each worker takes a GPU (a CPU "
                "with --device cpu) of a node; pip install 'flashcheck[ray]'")


def add_cluster(parser, help: str) -> None:
    """``--cluster``: the workers as actors of a Ray cluster (checked by
    :func:`flashcheck.campaign.ray_transport.check_cluster`, the one place that reads it)."""
    parser.add_argument("--cluster", default=None, metavar="ray|HOST:PORT|ray://HOST:PORT",
                        help=f"{help} ({CLUSTER_HELP})")


def add_json(parser, help: str) -> None:
    parser.add_argument("--json", default=None, metavar="PATH", help=help)


def add_backward(parser, help: str) -> None:
    parser.add_argument("--backward", action="store_true", help=help)
