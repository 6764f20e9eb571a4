"""Verdicts asserted inside a kernel author's own tests, ``@given`` ones included, and the failing case
saved with the exact command that replays it.

``assert_passes`` is a plain function, so no function-scoped fixture meets ``@given`` (hypothesis's health
check refuses those)::

    from hypothesis import given
    import flashcheck
    from flashcheck.strategies import cases

    @pytest.mark.flashcheck                  # in -m flashcheck and the summary; no hypothesis deadline
    @given(cases(spec=attention.spec, max_n=64))
    def test_attention_on_my_cases(case):
        flashcheck.assert_passes(attention, case)

Inside ``@given``, the case saved is the one hypothesis reports, after shrinking.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from hypothesis import currently_in_test_context, reject

from ..campaign.corpus import save_finding
from ..contract.formats import DEVICES
from ..errors import InvalidArgument
from ..files import replay_command as replay_path_command
from ..hypothesis_internals import final_run
from ..judge.check import check
from ..judge.verdict import BUG, SUSPICIOUS
from ..kernels.origin import import_root, reserved, source_of
from .session import Session, active_session, current_session, default_device

__all__ = ["KernelCheckFailed", "assert_passes", "display_path", "replay_command", "save_failure"]


class KernelCheckFailed(AssertionError):
    """A kernel got a failing verdict (BUG, or SUSPICIOUS when not allowed) on a case."""

    def __init__(self, message: str, verdict=None, path: Path | None = None, replay: str | None = None):
        super().__init__(message)
        self.verdict, self.path, self.replay = verdict, path, replay


def display_path(path: Path, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base.resolve()))
    except ValueError:
        return str(Path(path).resolve())


def replay_command(path: Path, kernel, *, device: str, session: Session) -> str:
    """The exact shell command, run from the directory pytest was started in, that re-runs a saved case.

    The case records how to reach its kernel (:func:`flashcheck.kernels.origin.kernel_origin`); a module
    that a fresh process would not find on its own gets a ``PYTHONPATH`` prefix as well."""
    command = replay_path_command(display_path(path, session.invocation_dir), device=device)
    prefix = ""
    source = source_of(kernel)
    if source and not reserved(source):
        root = import_root(source.split(":", 1)[0])
        known = {str(Path(p).resolve()) for p in session.import_paths if p}
        if root is not None and str(root) not in known:
            prefix = f"PYTHONPATH={shlex.quote(display_path(root, session.invocation_dir) or '.')} "
    return prefix + command


def save_failure(session: Session, verdict, case, kernel, *, label: str, device: str, corpus=None) -> tuple[Path, str]:
    folder = Path(corpus) if corpus is not None else session.corpus
    folder.mkdir(parents=True, exist_ok=True)
    if not (case.provenance or {}).get("kernel"):  # cases(): the kernel was not known when it was drawn
        case = dataclasses.replace(case, provenance={**(case.provenance or {}), "kernel": verdict.kernel})
    path = save_finding(folder, verdict, case, label=label, kernel=kernel)
    return path, replay_command(path, kernel, device=device, session=session)


def _in_hypothesis() -> bool:
    return currently_in_test_context()


def _final_hypothesis_run() -> bool:
    """True outside hypothesis, and on the run hypothesis reports (the shrunk failing example)."""
    if not _in_hypothesis():
        return True
    return final_run()


def assert_passes(kernel, case, *, allow_suspicious: bool = True, device: str | None = None, corpus=None,
                  **check_options):
    """Check ``kernel`` on ``case`` and return the verdict; raise :class:`KernelCheckFailed` (an
    ``AssertionError``) on BUG, and on SUSPICIOUS unless ``allow_suspicious``.

    A plain function: call it from any test, ``@given`` ones included, with no fixture. The failure
    message is the verdict and the ``flashcheck replay`` command of the case, saved under ``corpus``
    (default: the run's ``--flashcheck-corpus``). Inside ``@given`` only the case hypothesis finally
    reports is saved, not every step of its shrinking. A case the kernel declines
    (:class:`flashcheck.Unsupported`) or that does not fit in memory is not judged: inside ``@given``
    hypothesis discards it, in a plain pytest test the test is skipped, elsewhere the verdict is
    returned with ``verdict.skipped`` set. ``device`` defaults to ``--flashcheck-device``, else CUDA
    when available; ``check_options`` go to :func:`flashcheck.check`.

    Example::

        from flashcheck.strategies import cases

        @pytest.mark.flashcheck      # no hypothesis deadline (a kernel's first call compiles it)
        @given(cases(spec=attention.spec, max_n=64))
        def test_attention(case):
            flashcheck.assert_passes(attention, case)

    Without the marker, give the test ``@settings(deadline=None)`` or run with
    ``--hypothesis-profile flashcheck-ci``: hypothesis's default 200 ms deadline trips on a first call.
    """
    __tracebackhide__ = True  # pytest shows the verdict, not this function's source
    if not isinstance(allow_suspicious, bool):
        raise InvalidArgument("allow_suspicious", allow_suspicious, "expected True or False",
                              "Pass allow_suspicious=False to fail on SUSPICIOUS verdicts too.")
    if device is not None and device not in DEVICES:
        raise InvalidArgument("device", device, "unknown device", f"Pass one of {list(DEVICES)} or None.")
    session = current_session()
    device = default_device(session, device)
    verdict = check(kernel, case, device=device, **check_options)
    rec = session.record(verdict, case, source="assert_passes")
    if verdict.skipped:
        _not_judged(verdict.skipped)
        return verdict
    if verdict.status == BUG or (verdict.status == SUSPICIOUS and not allow_suspicious):
        path = replay = None
        lines = [str(verdict)]
        if _final_hypothesis_run():
            label = "shrunk" if _in_hypothesis() else "found"
            path, replay = save_failure(session, verdict, case, kernel, label=label, device=device, corpus=corpus)
            rec.update(saved=str(path), replay=replay)
            lines += [f"saved: {display_path(path, session.invocation_dir)}", f"replay: {replay}"]
        raise KernelCheckFailed("\n".join(lines), verdict, path, replay)
    return verdict


def _not_judged(reason: str) -> None:
    if _in_hypothesis():
        reject()
    if active_session() is not None:
        import pytest  # pytest is no dependency of flashcheck: only where a pytest run needs it

        pytest.skip(f"flashcheck did not judge the case: {reason}")


