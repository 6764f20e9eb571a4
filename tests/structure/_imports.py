"""The package's modules and the flashcheck modules each one imports, read from the source with ast."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "flashcheck"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted, without the "flashcheck." prefix ("" for the package)
    target: str  # the imported module, likewise
    names: tuple  # the names taken from it (empty for `import x`)
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(source: str, is_package: bool, level: int, module: str | None) -> str:
    base = source.split(".") if source else []
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def imports_of(path: Path) -> list[Import]:
    source = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                target = _resolve(source, path.name == "__init__.py", node.level, node.module)
            elif node.module and (node.module == "flashcheck" or node.module.startswith("flashcheck.")):
                target = node.module.removeprefix("flashcheck").lstrip(".")
            else:
                continue
            found.append(Import(source, target, tuple(a.name for a in node.names), node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flashcheck."):
                    found.append(Import(source, alias.name.removeprefix("flashcheck."), (), node.lineno))
    return found


def expand(imp: Import, known: set[str]) -> list[str]:
    """The modules an import reaches: ``from . import x`` reaches module ``x`` when it is one."""
    targets = [imp.target]
    for name in imp.names:
        sub = f"{imp.target}.{name}".strip(".")
        if sub in known:
            targets.append(sub)
    return targets
