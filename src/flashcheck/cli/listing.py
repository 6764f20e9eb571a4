"""``flashcheck kernels`` and ``flashcheck presets``: what can be named without reading the source."""

from __future__ import annotations

from ..words import listed, wrapped
from .options import EXIT_OK

__all__ = ["add_parser", "run_kernels", "run_presets"]


def add_parser(subparsers) -> None:
    subparsers.add_parser("kernels", help="list the built-in kernels, their options and their planted bugs"
                          ).set_defaults(run=run_kernels)
    subparsers.add_parser("presets", help="list the built-in campaign presets").set_defaults(run=run_presets)


def run_kernels(args) -> int:
    """The built-in kernels' names, each with what it is, the options it takes and its planted bugs."""
    # on first use: every command module loads at start-up
    from ..kernels.registry import BUILTIN_KERNELS, kernel_options, planted_bugs

    column = max(map(len, BUILTIN_KERNELS)) + 2
    for name, text in BUILTIN_KERNELS.items():
        lines = [f"{name:{column}}{text}"]
        if options := kernel_options(name):
            lines.append(f"{'':{column}}options: {listed(options, limit=None)}")
        if bugs := planted_bugs(name):
            lines.append(f"{'':{column}}planted bugs ({name}~NAME): {listed(bugs, limit=None)}")
        for line in lines:
            print(wrapped(line, indent=column))
    return EXIT_OK


def run_presets(args) -> int:
    """The built-in presets' names, each with its description."""
    # on first use: every command module loads at start-up
    from ..inputs.presets import builtin_presets, load_preset

    for name in builtin_presets():
        print(f"{name:14} {load_preset(name).description}")
    return EXIT_OK
