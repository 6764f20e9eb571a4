"""The numerics import at the top of each module: an import inside a function is there only to keep a heavy
module off the import path (mpmath, which the float64 oracle never needs), and says so in a comment on its
line. Read from the source (ast)."""

from __future__ import annotations

import ast

from ._imports import modules

NUMERICS = {name: path for name, path in modules().items() if name.startswith("numerics.")}


def lazy_imports(source: str) -> list[tuple[int, str]]:
    """(line, text) of every import inside a function."""
    lines = source.splitlines()
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found |= {(n.lineno, lines[n.lineno - 1]) for n in ast.walk(node)
                      if isinstance(n, (ast.Import, ast.ImportFrom))}
    return sorted(found)


def test_every_lazy_import_in_numerics_says_why():
    silent = [f"{name}:{line}: {text.strip()}" for name, path in NUMERICS.items()
              for line, text in lazy_imports(path.read_text()) if "#" not in text]
    assert not silent, f"{silent}: import at the module's top, or say on the line why the import must wait"


def test_lazy_imports_are_read_from_the_source():
    source = "import a\n\ndef f():\n    import b  # why\n    from c import d\n"
    assert lazy_imports(source) == [(4, "    import b  # why"), (5, "    from c import d")]
