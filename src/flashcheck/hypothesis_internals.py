"""The one module of flashcheck that reaches into hypothesis's internals: what it needs that hypothesis has
no public API for, each with what flashcheck does where the internal is gone.

- :func:`draw_from_prefix`: a draw whose first choices are given (``ConjectureData``, ``BuildContext``),
  serialised for an example database (``choices_to_bytes``): the covering order's planned cases. Gone: no
  planned case, and free drawing covers the cell.
- :func:`without_local_constants`: draws that ignore the literals of loaded local modules (the providers'
  constant pool), so that one seed gives one case list from any caller. Gone: draws as they come.
- :func:`add_digest` and :func:`set_database_key`: a test's database entries and random stream keyed by a
  test id as well as its body's source, and that key computed once (``function_digest``). Gone: hypothesis
  keys by the source alone, and computes the key itself at every run.
- :func:`given_settings` and :func:`set_given_settings`: the settings of a test already wrapped by ``@given``
  (the plugin's no-deadline for ``@pytest.mark.flashcheck``). Gone: the test keeps its own.
- :func:`final_run`: whether the example running is the one hypothesis reports. Gone: every one is.

These internals were tested with the hypothesis versions of :data:`TESTED` (``pyproject.toml`` pins the same
range, ``tests/structure/test_hypothesis_internals.py`` keeps the two equal and fails on another installed
version). Importing this module with another version warns once (:class:`UntestedHypothesis`). No other
module of flashcheck imports ``hypothesis.internal`` or touches a private hypothesis name (the same test).
"""

from __future__ import annotations

import contextlib
import random
import warnings
from dataclasses import dataclass

import hypothesis
from hypothesis import settings

__all__ = ["TESTED", "Drawn", "UntestedHypothesis", "VersionRange", "add_digest", "draw_from_prefix", "final_run",
           "given_settings", "set_database_key", "set_given_settings", "warn_if_untested", "without_local_constants"]


@dataclass(frozen=True)
class VersionRange:
    """The hypothesis versions from ``low`` up to, not including, ``high``."""

    low: tuple[int, ...]
    high: tuple[int, ...]

    @property
    def requirement(self) -> str:
        """As ``pyproject.toml`` writes it."""
        return f"hypothesis>={_dotted(self.low)},<{_dotted(self.high)}"

    def holds(self, version: tuple[int, ...]) -> bool:
        return self.low <= tuple(version) < self.high

    def problem(self, version: tuple[int, ...]) -> str | None:
        """What is wrong with hypothesis ``version``, and what to do; None within the range."""
        if self.holds(version):
            return None
        return (f"flashcheck was tested with {self.requirement}, and hypothesis {_dotted(version)} is installed: "
                "a seed may draw other cases than under a tested version, and the covering order, fixed case lists "
                "and example-database keys, which use hypothesis's internals, may fall back to its plain drawing. "
                f"Install a tested version: pip install '{self.requirement}'. To support this one, run "
                "tests/structure and tests/unit with it, then widen TESTED in flashcheck/hypothesis_internals.py "
                "and the pin in pyproject.toml together.")


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(part) for part in version)


# The internals are there from 6.134 (BuildContext's wrapped_test); from 6.152.9 on, hypothesis also draws
# the case lists of a seed that flashcheck's tests pin (saved seeds, corpora, sign-off lists). 6.170.27 is
# the newest tested.
TESTED = VersionRange(low=(6, 152, 9), high=(6, 171))


class UntestedHypothesis(UserWarning):
    """The installed hypothesis is outside :data:`TESTED`."""


def warn_if_untested(version: tuple[int, ...] = hypothesis.__version_info__) -> bool:
    """Warn when ``version`` (default: the installed one) is outside :data:`TESTED`; True if it is."""
    problem = TESTED.problem(version)
    if problem is not None:
        warnings.warn(problem, UntestedHypothesis, stacklevel=2)
    return problem is not None


warn_if_untested()


@dataclass(frozen=True)
class Drawn:
    """A value drawn from a strategy, with the choices that draw it again (as an example database holds them)."""

    choices: bytes
    value: object


def draw_from_prefix(strategy, prefix: list[int], *, seed: int) -> Drawn | None:
    """What ``strategy`` draws when its first choices are ``prefix`` (each an index into a sampled pool) and
    the rest come from ``seed``; None when this hypothesis cannot draw so (its internals moved)."""
    try:  # here, not at the top: a hypothesis without them falls back, and flashcheck still imports
        from hypothesis.control import BuildContext
        from hypothesis.database import choices_to_bytes
        from hypothesis.internal.conjecture.data import ConjectureData
    except ImportError:
        return None
    try:
        data = ConjectureData(random=random.Random(seed), prefix=prefix)
        with BuildContext(data, is_final=False, wrapped_test=None):
            value = data.draw(strategy)
        return Drawn(choices_to_bytes(tuple(data.choices)), value)
    except Exception:  # noqa: BLE001 - another hypothesis, another signature: nothing drawn
        return None


@contextlib.contextmanager
def without_local_constants():
    """Hypothesis draws, now and then, a literal found in any loaded local module (the calling script,
    test files, an editable install): the same seed then gave another case list from another caller.
    Fixed lists leave those literals out (hypothesis has no setting for it, hence its internals)."""
    try:  # here, not at the top, like every internal of this module: a hypothesis without it falls back
        from hypothesis.internal.conjecture import providers

        original, cache, empty = providers._get_local_constants, providers.CONSTANTS_CACHE.cache, providers.Constants
    except (ImportError, AttributeError):  # another hypothesis: its draws as they come
        yield
        return
    providers._get_local_constants = empty
    cache.clear()  # its entries hold the local literals
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


def add_digest(body, digest: bytes) -> None:
    """Key the database entries and the random stream of the test ``body`` becomes by ``digest`` (a test id)
    as well as by its source; before ``@given`` wraps it."""
    body._hypothesis_internal_add_digest = digest


_KEYS: dict = {}


def set_database_key(test, body, digest: bytes | None) -> None:
    """Give ``test`` (``body`` wrapped by ``@given``) the database key hypothesis would compute from the body's
    source at every run (tokenising it: ~10 ms, and a campaign starts an engine per planned case), computed
    once per function and digest."""
    try:  # here, not at the top: a hypothesis without it falls back, and flashcheck still imports
        from hypothesis.internal.reflection import function_digest
    except ImportError:  # another hypothesis: it computes the key itself
        return
    key = (getattr(body, "__func__", body), digest)
    if key not in _KEYS:
        _KEYS[key] = function_digest(body)
    test._hypothesis_internal_database_key = _KEYS[key]


def given_settings(test) -> settings:
    """The settings a ``@given`` test runs with."""
    return getattr(test, "_hypothesis_internal_use_settings", None) or settings.default


def set_given_settings(test, new: settings) -> None:
    """Run the ``@given`` test ``test`` with ``new`` (``@settings`` refuses a test it was already applied to)."""
    test._hypothesis_internal_use_settings = new


def final_run() -> bool:
    """Inside a hypothesis test: True on the run hypothesis reports (the shrunk failing example)."""
    try:  # here, not at the top: a hypothesis without it falls back, and flashcheck still imports
        from hypothesis.control import current_build_context
    except ImportError:
        return True
    return bool(getattr(current_build_context(), "is_final", True))
