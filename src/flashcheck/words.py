"""Counts in words for the report's sentences: "1 case", "2,730 cases"."""

from __future__ import annotations

__all__ = ["counted"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun`` ("fp16 case", "judged case"), the noun's last word in the plural unless n is 1."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"
