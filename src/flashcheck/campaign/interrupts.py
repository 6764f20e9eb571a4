"""Ctrl-C and SIGTERM that arrive before a campaign handles them itself.

``flashcheck fuzz`` spends its first seconds importing torch and loading the kernel. A signal there used to
end the process with a ``KeyboardInterrupt`` traceback and no summary. :func:`defer` makes such a signal
a pending request instead; the campaign takes it (:func:`take_pending`) when it installs its own handlers,
and so stops before its first case with its summary (``NO_CASES``) printed and written. A second signal
while one is pending raises at once: the user insists. Commands without a campaign call :func:`restore`.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["defer", "defer_terminate", "handle_signals", "restore", "restore_handlers", "restore_quietly",
           "sigint_ignored_by_children", "stop_requests", "take_pending"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}


class _Pending:
    """The signals received while deferred."""

    count = 0

    @classmethod
    def record(cls, signum, frame) -> None:
        cls.count += 1

    @classmethod
    def on_signal(cls, signum, frame) -> None:
        cls.count += 1
        if cls.count > 1:
            raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def defer() -> None:
    """From now on a SIGINT or SIGTERM is recorded, not raised (main thread only)."""
    if _main_thread():
        for s in _SIGNALS:
            signal.signal(s, _Pending.on_signal)


def defer_terminate() -> None:
    """In a campaign's worker process: SIGTERM (the parent asks it to stop, once a second) is recorded
    until its campaign takes it; it never raises, since the parent kills a worker that does not stop."""
    if _main_thread():
        signal.signal(signal.SIGTERM, _Pending.record)


def take_pending() -> bool:
    """Whether a signal arrived while deferred (and forget it)."""
    pending, _Pending.count = _Pending.count > 0, 0
    return pending


def restore_quietly() -> bool:
    """Python's own handlers again; returns whether a signal was pending (and forgets it)."""
    if _main_thread():
        for s, handler in _DEFAULTS.items():
            signal.signal(s, handler)
    return take_pending()


def restore() -> None:
    """Python's own handlers again; a signal that arrived meanwhile is raised now, as KeyboardInterrupt."""
    if restore_quietly():
        raise KeyboardInterrupt


@contextmanager
def sigint_ignored_by_children():
    """Processes started inside ignore SIGINT from their first instruction: Ctrl-C reaches the whole
    process group, and a spawned Python interrupted while it imports its site module dies with a fatal
    error. An ignored signal stays ignored across exec; the parent's own handler comes back after."""
    if not _main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def handle_signals(handler) -> tuple[dict, bool]:
    """``handler`` for SIGINT and SIGTERM (main thread only): the handlers it replaced, and whether a
    signal was pending from before (then forgotten)."""
    if not _main_thread():
        return {}, False  # signal handlers can only be set in the main thread
    previous = {s: signal.getsignal(s) for s in _SIGNALS}
    for s in previous:
        signal.signal(s, handler)
    return previous, take_pending()


def restore_handlers(previous: dict) -> None:
    for s, handler in previous.items():
        signal.signal(s, handler)


@contextmanager
def stop_requests(request):
    """Inside, SIGINT and SIGTERM call ``request()`` (a signal that came while the command started up
    calls it at once); the previous handlers come back after."""
    previous, pending = handle_signals(lambda signum, frame: request())
    if pending:
        request()
    try:
        yield
    finally:
        restore_handlers(previous)
