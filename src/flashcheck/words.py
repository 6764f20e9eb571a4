"""Counts and lists in words for the report's and the CLI's sentences: "1 case", "2,730 cases", "a, b, c
and 145 more", and lines wrapped at the terminal's width."""

from __future__ import annotations

import re
import shutil
import textwrap

__all__ = ["DEFAULT_WIDTH", "SHOWN", "counted", "listed", "terminal_width", "wrapped"]

SHOWN = 5  # the items a list in the console shows before "and N more" (the JSON keeps them all)
DEFAULT_WIDTH = 100  # the width of lines when stdout is no terminal (a log, a pipe)
_NARROWEST = 40  # a terminal narrower than this gets lines this wide: broken lines, not one word each


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` ("fp16 case", "judged case"), the noun's last word in the plural unless n is 1."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def listed(items, limit: int | None = SHOWN) -> str:
    """``items`` joined by commas: past ``limit`` (None: no limit) the first ``limit`` and "and N more"."""
    items = list(items)
    if limit is None or len(items) <= limit:
        return ", ".join(items)
    return f"{', '.join(items[:limit])} and {len(items) - limit:,} more"


def terminal_width() -> int:
    """The terminal's width in columns ($COLUMNS first), :data:`DEFAULT_WIDTH` when stdout is no terminal."""
    return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, _NARROWEST)


def wrapped(line: str, width: int | None = None, indent: int | None = None) -> str:
    """``line`` broken between words to fit ``width`` (default: the terminal's), never before a number, so
    that a listed item stays whole with its count ("page_order 1"). Its continuation lines are indented
    ``indent`` spaces (default: four past the line's own indent). A word longer than the width stays whole."""
    body = line.lstrip(" ")
    lead = len(line) - len(body)
    text = textwrap.fill(line[:lead] + _BEFORE_A_NUMBER.sub(_GLUE, body), width or terminal_width(),
                         subsequent_indent=" " * (lead + 4 if indent is None else indent), break_long_words=False,
                         break_on_hyphens=False)
    return text.replace(_GLUE, " ")


_GLUE = "\x00"  # a space that is no place to break
_BEFORE_A_NUMBER = re.compile(r" (?=\d)")
