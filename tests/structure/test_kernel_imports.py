"""The kernels layer's imports: no cycle among its modules (the forward and the backward Triton kernels share what
both need from a third module), and each import a function keeps lazy says why in a comment (it keeps triton,
torch._dynamo or torch out of a path that must not import them). Read from the source (ast), lazy imports
included."""

from __future__ import annotations

import ast

from ._imports import Import, expand, imports_of, modules

MODULES = modules()
# A package's __init__ is a facade whose imports are lazy (PEP 562): reaching a submodule through it is no cycle.
KERNELS = {name: path for name, path in MODULES.items()
           if name.startswith("kernels.") and path.name != "__init__.py"}
# Modules of other layers whose lazy imports follow the same rule.
LAZY_CHECKED = {**KERNELS, "cli.options": MODULES["cli.options"], "judge.merge": MODULES["judge.merge"],
                **{name: path for name, path in MODULES.items() if name.startswith("inputs.")}}


def _graph(imports: dict[str, list[Import]]) -> dict[str, set[str]]:
    known = set(imports)
    return {name: {t for imp in found for t in expand(imp, known) if t in known and t != name}
            for name, found in imports.items()}


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of ``graph`` (its modules in import order, the first again at the end), or []."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str]:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = 2
        return []

    for start in sorted(graph):
        if start not in state and (found := visit(start, [])):
            return found
    return []


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


def test_the_kernels_layer_has_no_import_cycle():
    found = cycle(_graph({name: imports_of(path) for name, path in KERNELS.items()}))
    assert not found, f"import cycle: {' -> '.join(found)}"


def test_every_lazy_import_says_why():
    found = {name: lines for name, path in LAZY_CHECKED.items() if (lines := uncommented_lazy_imports(path.read_text()))}
    assert not found, f"imports inside functions without a comment saying why they are lazy: {found}"


def test_the_rules_see_what_they_forbid():
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
    assert uncommented_lazy_imports("def f():\n    import torch\n") == [2]
    assert uncommented_lazy_imports("def f():\n    import torch  # lazy: heavy\n") == []
    assert uncommented_lazy_imports("def f():\n    # lazy: heavy\n    import a\n    import b\n") == []
