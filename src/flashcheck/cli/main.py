"""The ``flashcheck`` command: ``fuzz`` a kernel, ``replay`` a saved case, ``selftest``, ``signoff``
kernels with a report, re-render or compare reports (``report``), ``merge`` summaries, list ``kernels`` and
``presets``. Each command is a module of :mod:`flashcheck.cli` that adds its own parser and runs it; what
they share (exit codes, options, the device) is :mod:`flashcheck.cli.options`.

Exit status: 0 when nothing is wrong, 1 when a bug was found, 2 on a usage error, 3 when a campaign judged
no case at all (every case skipped, or none run): its verdict is NO_CASES, never PASS. 130 when Ctrl-C
came before a command had a result to report.
"""

from __future__ import annotations

import argparse
import sys
import time

from ..campaign import interrupts
from ..campaign.clock import process_start
from ..campaign.worker_child import quiet_interpreter
from ..errors import FlashcheckError
from .fuzz import add_parser as add_fuzz
from .listing import add_parser as add_listing
from .merge import add_parser as add_merge
from .options import EXIT_USAGE, check_options, prepare_device
from .replay import add_parser as add_replay
from .repro import add_parser as add_repro
from .selftest import add_parser as add_selftest
from .signoff import add_parser as add_signoff

__all__ = ["main"]

_DESCRIPTION = ("Numerical property testing for tiled (flash) attention kernels: fuzz a kernel, replay a saved "
                "case, self-test, sign off kernels with a report.")
# Each command module adds its own parser, in the order `flashcheck --help` lists their commands. (By name,
# not as `from . import fuzz`: that would import this package, which imports this module.)
_ADD_PARSERS = (add_fuzz, add_replay, add_repro, add_selftest, add_signoff, add_merge, add_listing)
# Their campaigns take a Ctrl-C that came while they started up, and stop with a summary.
_CAMPAIGN_COMMANDS = ("fuzz", "signoff")


def _parser() -> tuple[argparse.ArgumentParser, dict]:
    """The top-level parser, and its commands' parsers by name: each command module adds its own."""
    parser = argparse.ArgumentParser(prog="flashcheck", description=_DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser in _ADD_PARSERS:
        add_parser(commands)
    return parser, commands.choices


def main(argv=None) -> int:
    interrupts.defer()  # a Ctrl-C while torch loads is a request to stop, not a traceback
    started_at = process_start() if argv is None else time.monotonic()  # what first_case_s counts from
    argv = list(sys.argv[1:] if argv is None else argv)
    prepare_device(argv)
    try:
        args = _parser()[0].parse_args(argv)
        args.started_at = started_at
        args.argv = argv[1:]  # what follows the command's name, for a report to name the command it ran
        return _run_command(args)
    except KeyboardInterrupt:
        names = _parser()[1]  # built again: the interrupt may have come while the first one was built
        command = next((a for a in argv if a in names), "")
        print(f"flashcheck {command}: interrupted (Ctrl-C) before it had a result to report".replace("  ", " "),
              file=sys.stderr)
        return 130
    finally:
        interrupts.restore_quietly()


def _run_command(args) -> int:
    """The command ``args`` names, with its options checked first; flashcheck's own errors are usage errors."""
    quiet_interpreter()
    if args.command not in _CAMPAIGN_COMMANDS:
        interrupts.restore()  # raises KeyboardInterrupt if one came meanwhile
    try:
        check_options(args)
        return args.run(args)
    except FlashcheckError as exc:
        print(f"flashcheck: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
