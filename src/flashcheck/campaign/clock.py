"""When this process started, on the ``time.monotonic()`` clock: what a campaign's ``first_case_s`` counts from.

``flashcheck fuzz`` reports the seconds from the start of its process (the interpreter's start, before
any import) to the end of the first judged case, the time a user waits for the first result. On Linux
the start is read from ``/proc/self/stat``; elsewhere, or if that cannot be read, it is the moment this
module was first imported (the CLI imports it early). ``time.monotonic()`` is one clock for every
process of the machine, so a ``--jobs`` worker counts from its parent's start.
"""

from __future__ import annotations

import os
import time

__all__ = ["process_start"]

_IMPORTED = time.monotonic()


def _age_from_proc() -> float | None:
    """Seconds since this process started, from /proc (Linux), or None."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # after "pid (comm) ": state is field 3, starttime field 22 (in clock ticks since boot)
        ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return age if 0.0 <= age else None


def process_start() -> float:
    """``time.monotonic()`` at this process's start (its ``/proc`` start time, else when this module was
    first imported; never later than that)."""
    now = time.monotonic()
    age = _age_from_proc()
    return _IMPORTED if age is None else min(now - age, _IMPORTED)
