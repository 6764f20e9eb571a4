"""Imports at the top of each module: an import inside a function says in a comment why it must wait (it keeps
torch, triton, hypothesis, matplotlib or mpmath off a path that must not load them, keeps pytest to a pytest run,
or breaks a cycle). Every module of the package, read from the source (ast)."""

from __future__ import annotations

import ast

from ._imports import modules

MODULES = modules()


def uncommented_lazy_imports(source: str) -> list[int]:
    """The lines of imports inside functions with no comment on them, on an import just above, or on the line
    above those."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for imp in (n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))):
            first = imp.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith(("import ", "from ")):
                first -= 1
            if not any("#" in line for line in lines[max(first - 1, 0):imp.end_lineno]):
                found.append(imp.lineno)
    return sorted(set(found))


def test_every_lazy_import_says_why():
    found = {name or "flashcheck": lines for name, path in MODULES.items()
             if (lines := uncommented_lazy_imports(path.read_text()))}
    assert not found, (f"imports inside functions without a comment saying why they wait: {found} (import at the "
                       "module's top, or say on the line why the import must wait)")


def test_the_rule_sees_what_it_forbids():
    assert uncommented_lazy_imports("def f():\n    import torch\n") == [2]
    assert uncommented_lazy_imports("def f():\n    import torch  # lazy: heavy\n") == []
    assert uncommented_lazy_imports("def f():\n    # lazy: heavy\n    import a\n    import b\n") == []
    assert uncommented_lazy_imports("def f():\n    import a  # lazy: heavy\n\n    from b import c\n") == [4]
    # imports at the top are no business of the rule; those in nested and async functions are
    assert uncommented_lazy_imports("import a\nfrom b import c\n") == []
    assert uncommented_lazy_imports("def f():\n    def g():\n        import a\n") == [3]
    assert uncommented_lazy_imports("async def f():\n    from a import b\n") == [2]
