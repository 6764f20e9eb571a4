"""Where a kernel came from, so that a saved case can reach it again.

A kernel's ``name`` is for people and reports (``@flashcheck.kernel(name="mylib:decode")``); its
*source* is what resolves back to it: the built-in name with its options, or the import path
``module:function``, as the user passed it or as the decorated function's module and qualified name
give it. A saved case records both, and the folder its module was imported from, so that
``flashcheck replay CASE`` runs on the same kernel from any folder.

Which a source is, a built-in's name or an import path, is decided here, by its prefix (:func:`reserved`), and
read without torch: the CLI adds the current folder to ``sys.path`` for an import path before it imports torch.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

__all__ = ["RESERVED_PREFIXES", "import_root", "kernel_origin", "importable_from", "reserved", "source_of"]

# The built-in kernels' prefixes (flashcheck.kernels.builtins names them all so): a source under one is a
# built-in's name, or an unknown one, never an import path.
RESERVED_PREFIXES = ("torch", "flashcheck", "fla", "sglang", "sage")


def reserved(source: str) -> bool:
    """Whether ``source`` (``prefix:rest``) lies under a built-in's prefix, where no import path may."""
    prefix, colon, _ = source.partition(":")
    return bool(colon) and prefix in RESERVED_PREFIXES


def _lookup(module_name: str, qualname: str):
    obj = sys.modules.get(module_name)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def _function_path(kernel) -> str | None:
    """``module:qualname`` of a kernel object when that path leads back to it (not a local function,
    not ``__main__``, which another process cannot import)."""
    fn = getattr(kernel, "fn", kernel)
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or not qualname or "<locals>" in qualname or module == "__main__":
        return None
    found = _lookup(module, qualname)
    if found is not kernel and getattr(found, "fn", found) is not fn:
        return None  # that name now holds something else
    return f"{module}:{qualname}"


def source_of(kernel) -> str | None:
    """The name that resolves back to ``kernel``: what it was resolved from, else its import path."""
    if isinstance(kernel, str):
        return kernel
    return getattr(kernel, "source", None) or _function_path(kernel)


def import_root(module_name: str) -> Path | None:
    """The ``sys.path`` entry that ``module_name`` was imported from (None for a built-in module)."""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file:
        return None
    root = Path(file).resolve().parent
    if Path(file).name == "__init__.py":
        root = root.parent
    for _ in range(module_name.count(".")):
        root = root.parent
    return root


def kernel_origin(kernel) -> dict:
    """What a saved case records of its kernel: ``kernel_source`` and ``kernel_import_root`` (either
    may be None: a kernel defined inside a function has no path another process can import)."""
    source = source_of(kernel)
    root = None
    if source and ":" in source and not reserved(source):
        found = import_root(source.split(":", 1)[0])
        root = str(found) if found is not None else None
    return {"kernel_source": source, "kernel_import_root": root}


def importable_from(folders) -> None:
    """Let import paths resolve from ``folders`` too (the current folder first, as ``python -m`` does;
    then, for a saved case, the folder its kernel's module came from), where they exist."""
    for i, folder in enumerate(f for f in folders if f):
        if Path(folder).is_dir() and folder not in sys.path and not (i == 0 and "" in sys.path):
            sys.path.insert(i, folder)
    importlib.invalidate_caches()
