"""The one check of every count and duration an option or argument takes (tile sizes, cases, jobs,
digits, seconds): a whole number, not a bool, within its range, else an :class:`InvalidArgument` that
names the argument, echoes the value and says what to pass. Imports neither torch nor numpy, so the CLI
checks its options with it before anything heavy loads."""

from __future__ import annotations

import math
import numbers

from ..errors import InvalidArgument

__all__ = ["check_count", "check_seconds", "check_sizes"]


def check_count(argument: str, value, *, minimum: int = 1, maximum: int | None = None, none_ok: bool = False,
                what: str | None = None, fix: str | None = None) -> int | None:
    """``value`` as an int in ``[minimum, maximum]``; None passes when ``none_ok``. ``what`` names what is
    counted in the message ("a number of cases"), ``fix`` replaces the default advice."""
    if value is None and none_ok:
        return None
    whole = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if whole and value >= minimum and (maximum is None or value <= maximum):
        return int(value)
    bounds = f"at least {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    problem = f"expected {what or 'a whole number'}, {bounds}" + (", or None" if none_ok else "")
    within = f"N >= {minimum}" if maximum is None else f"{minimum} <= N <= {maximum}"
    default = f"Pass {argument} as a whole number N, {within}" + (", or None for the default." if none_ok else ".")
    raise InvalidArgument(argument, value, problem, fix or default)


def check_seconds(argument: str, value, *, none_ok: bool = False, fix: str | None = None) -> float | None:
    """``value`` as a positive, finite number of seconds; None passes when ``none_ok``."""
    if value is None and none_ok:
        return None
    number = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if number and value > 0 and math.isfinite(value):
        return float(value)
    raise InvalidArgument(argument, value, "expected a positive number of seconds",
                          fix or f"Pass e.g. {argument}=600" + (", or None for no limit." if none_ok else "."))


def check_sizes(argument: str, value, *, maximum: int | None = None, fix: str | None = None) -> tuple | None:
    """A size or sizes as a sorted tuple of counts, each at most ``maximum`` (None stays None: any size)."""
    if value is None:
        return None
    sizes = (value,) if isinstance(value, int) else tuple(value)
    for size in sizes:
        check_count(argument, size, maximum=maximum, fix=fix)
    if not sizes:
        raise InvalidArgument(argument, value, "empty", "Pass None or a list of sizes.")
    return tuple(sorted(sizes))
