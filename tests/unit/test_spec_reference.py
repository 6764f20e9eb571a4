"""docs/spec.md documents every field of the kernel spec with the code's default: the table cannot go stale."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import flashcheck
from flashcheck.contract.spec import KernelSpec

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "spec.md"
# What @flashcheck.kernel takes besides the spec's fields.
DECORATOR_ONLY = {"name": inspect.signature(flashcheck.kernel).parameters["name"].default}


def documented(text: str) -> list[tuple[str, str]]:
    """``(field, default as written)`` of each table row whose first cell is a field in backticks."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 3 and re.fullmatch(r"`\w+`", cells[0]):
            rows.append((cells[0].strip("`"), cells[1]))
    return rows


def code_defaults() -> dict:
    return {**{f.name: f.default for f in dataclasses.fields(KernelSpec)}, **DECORATOR_ONLY}


def test_every_field_of_the_spec_is_documented_once():
    names = [name for name, _ in ROWS]
    assert len(names) == len(set(names)), f"documented twice: {sorted({n for n in names if names.count(n) > 1})}"
    fields = set(code_defaults())
    assert set(names) == fields, (f"missing from docs/spec.md: {sorted(fields - set(names))}; "
                                  f"not spec fields: {sorted(set(names) - fields)}")


ROWS = documented(REFERENCE.read_text())


@pytest.mark.parametrize("name, written", ROWS, ids=[name for name, _ in ROWS])
def test_each_documented_default_is_the_codes(name, written):
    assert re.fullmatch(r"`[^`]+`", written), f"{name}: its default {written!r} is not one literal in backticks"
    assert ast.literal_eval(written.strip("`")) == code_defaults()[name], f"{name}: docs/spec.md says {written}"


def test_a_stale_table_is_seen():
    row = "| `nan_safe_masking` | `True` | a promise |"
    assert documented(row) == [("nan_safe_masking", "`True`")]
    assert ast.literal_eval("True") != code_defaults()["nan_safe_masking"]
    assert documented("| `alibi` | `None` | \\|i - j\\| |") == [("alibi", "`None`")]
