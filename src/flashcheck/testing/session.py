"""One pytest run as flashcheck sees it: its options (command line, the test's own values, ini keys),
the verdicts its checks recorded, where failing cases go, and hypothesis's profiles for it.

The plugin (:mod:`flashcheck.plugin`) pushes a :class:`Session` when a run starts; checks made outside
pytest get a default one. Nothing heavy is imported here.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["DEFAULT_CORPUS", "DEFAULT_PRESET", "PROFILES", "Session", "active_session", "current_session",
           "default_device", "pop_session", "push_session", "register_profiles", "summary_rows"]

DEFAULT_PRESET = "smoke"
DEFAULT_CORPUS = ".flashcheck/corpus"
# Hypothesis settings profiles (``pytest --hypothesis-profile NAME``, or settings.load_profile(NAME)
# after register_profiles()). flashcheck-long also raises property_test's example count.
PROFILES = {
    "flashcheck-ci": dict(derandomize=True, deadline=None, database=None, print_blob=True),
    "flashcheck-long": dict(max_examples=2000, deadline=None),
}


def register_profiles() -> None:
    """Register the hypothesis profiles of :data:`PROFILES` not registered yet (the plugin does it when
    ``--hypothesis-profile`` names one, and property tests when they run); a profile of that name that
    a user registered first is kept."""
    # hypothesis on first use: the plugin imports this module in every pytest run
    from hypothesis import settings
    from hypothesis.errors import InvalidArgument as NoSuchProfile

    for name, values in PROFILES.items():
        try:
            settings.get_profile(name)
        except NoSuchProfile:
            settings.register_profile(name, **values)


@dataclass
class Session:
    """Options of one pytest run, the verdicts it recorded and where failing cases go.

    ``cli`` and ``ini`` hold the options given on the command line and as ini keys, apart, since a
    value written in a test (``property_test(..., max_examples=...)``) sits between the two.
    """

    cli: dict = field(default_factory=dict)
    ini: dict = field(default_factory=dict)
    corpus: Path = field(default_factory=lambda: Path.cwd() / DEFAULT_CORPUS)
    invocation_dir: Path = field(default_factory=Path.cwd)
    import_paths: tuple = ()  # sys.path entries a fresh `flashcheck replay` process also has
    require_gpu: bool = False
    records: list = field(default_factory=list)
    current_test: str | None = None

    def option(self, name: str, code_value=None, default=None):
        """Command line, then the test's own value, then the ini key, then ``default``."""
        for value in (self.cli.get(name), code_value, self.ini.get(name)):
            if value is not None:
                return value
        return default

    def record(self, verdict, case, *, source: str, test: str | None = None, **extra) -> dict:
        rec = verdict.as_dict()
        rec.update(test=test or self.current_test, dtype=case.dtype, source=source, **extra)
        self.records.append(rec)
        return rec


_SESSIONS: list[Session] = []


def push_session(session: Session) -> None:
    _SESSIONS.append(session)


def pop_session(session: Session) -> None:
    if session in _SESSIONS:
        _SESSIONS.remove(session)


def active_session() -> Session | None:
    return _SESSIONS[-1] if _SESSIONS else None


def current_session() -> Session:
    """The pytest run's session; outside pytest a default one (auto device, corpus under the cwd)."""
    return active_session() or Session(import_paths=tuple(sys.path))


def default_device(session: Session, code_value=None) -> str:
    device = session.option("device", code_value)
    if device is None:
        import torch  # on first use: the plugin imports this module in every pytest run

        device = "cuda" if session.require_gpu or torch.cuda.is_available() else "cpu"
    return device



def summary_rows(records: list) -> list[dict]:
    """One row per kernel, dtype and pass (forward or backward): cases (``shrinking`` of them tried while hypothesis shrank a failure),
    verdicts, skips, the largest error/budget, and the replay commands of the failing cases saved."""
    rows: dict = {}
    for r in records:
        key = (r.get("kernel") or "?", r.get("dtype") or "?", r.get("pass") or "forward")
        row = rows.setdefault(key, {"kernel": key[0], "dtype": key[1], "pass": key[2], "cases": 0, "PASS": 0,
                                    "SUSPICIOUS": 0, "BUG": 0, "skipped": 0, "shrinking": 0, "max_ratio": None,
                                    "replay": []})
        row["cases"] += 1
        row["shrinking"] += r.get("phase") == "shrink"
        if r.get("skipped"):
            row["skipped"] += 1
        else:
            row[r["status"]] += 1
        ratio = r.get("max_ratio")
        if isinstance(ratio, (int, float)) and math.isfinite(ratio):
            row["max_ratio"] = ratio if row["max_ratio"] is None else max(row["max_ratio"], ratio)
        if r.get("replay"):
            row["replay"].append(r["replay"])
    return [rows[k] for k in sorted(rows)]
