"""Modules and functions of a size one can read: no module over 400 lines and no function over 80, outside
the Triton kernel sources (their kernels stay whole: the planted bugs of the self-test edit their text)."""

from __future__ import annotations

import ast

import pytest

from ._imports import PACKAGE, modules

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80
KERNEL_SOURCES = {"kernels.triton.forward", "kernels.triton.backward"}
CHECKED = {name: path for name, path in modules().items() if name not in KERNEL_SOURCES}


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    return [f"{node.name} (line {node.lineno}, {node.end_lineno - node.lineno + 1} lines)"
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit]


def test_the_kernel_sources_exist():
    assert all((PACKAGE / f"{name.replace('.', '/')}.py").is_file() for name in KERNEL_SOURCES)


@pytest.mark.parametrize("module", sorted(CHECKED))
def test_modules_stay_under_400_lines(module):
    lines = len(CHECKED[module].read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{module} has {lines} lines: split it where the split names something"


@pytest.mark.parametrize("module", sorted(CHECKED))
def test_functions_stay_under_80_lines(module):
    found = long_functions(CHECKED[module].read_text())
    assert not found, f"{module}: {found}"


def test_a_long_function_is_seen():
    body = "\n".join(f"    x = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [f"f (line 1, {MAX_FUNCTION_LINES + 1} lines)"]
    assert long_functions("def g():\n    return 1\n") == []
