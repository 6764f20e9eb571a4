"""The split-KV form: a serving kernel that splits each sequence's keys into parts and merges their partial
states, called with the keyword ``num_splits`` at each split count its spec declares (with ``split_invariant``,
every count must give the first's bits)."""

from __future__ import annotations

from .forms import Form


def _settings(spec) -> tuple | None:
    return spec.num_splits


def _keywords(n: int) -> dict:
    return {"num_splits": n}


def _label(n: int) -> str:
    return f"num_splits={n}"


def _script(spec) -> dict:
    """The split counts the reproducer calls the kernel at (None: one call without the keyword)."""
    return {"num_splits": None if spec.num_splits is None else list(spec.num_splits)}


FORM = Form("split_kv", settings=_settings, keywords=_keywords, label=_label, script=_script,
            script_keys=("num_splits",))
