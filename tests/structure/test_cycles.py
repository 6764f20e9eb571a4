"""No import cycles: a module that imports another, directly or through others, is not imported back by it
(``from . import x`` imports the package too). Read from the source (ast), lazy imports included."""

from __future__ import annotations

from ._imports import expand, imports_of, modules

MODULES = modules()


def import_graph() -> dict[str, set[str]]:
    graph = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for imp in imports_of(path):
            graph[module] |= {t for t in expand(imp, set(MODULES)) if t in MODULES and t != module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, without recursion)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_cycle():
    found = [sorted(c) for c in cycles(import_graph())]
    assert not found, f"import cycles: {found} (import a module by its name, not its package's; or move what both need)"


def test_a_cycle_is_seen():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert cycles({"a": {"b"}, "b": set()}) == []
