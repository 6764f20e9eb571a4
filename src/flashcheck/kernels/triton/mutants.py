"""Planted-bug variants of ``flashcheck:triton``, made by editing the kernel's source text.

flashcheck proves its error model on defects a kernel author could really write. Each :class:`Mutant`
is a list of small text edits to ``flashcheck/kernels/triton/forward.py`` (the forward pass) or to
``flashcheck/kernels/triton/backward.py``, written in :mod:`.planted` (the attention variants' in
:mod:`.planted_variants`, the long sequences' in :mod:`.planted_long`, those of the defect models in
:mod:`.planted_defects`) and catalogued with every built-in's
planted bugs in :mod:`flashcheck.kernels.planted`; the production kernel carries no bug switches.
:func:`load_mutant` writes the edited source to a private temporary directory, imports it as
``flashcheck.kernels.triton._mutant_<name>`` and returns its kernel, which keeps the correct kernel's spec (a mutant claims to be correct, as a buggy
kernel would). A backward mutant's kernel is a copy of the forward module whose autograd backward imports
the edited backward module.

Nothing here imports triton: the mutated module imports it on its first call, like the real one, so
``TRITON_INTERPRET=1`` must be set before that call to run a mutant on CPU tensors.
"""

from __future__ import annotations

import atexit
import importlib.util
import shutil
import sys
import tempfile
import threading
from pathlib import Path

from ...contract.spec import Kernel
from ...errors import FlashcheckError, InvalidArgument
from ..planted import TRITON
from . import forward as triton_flash
from .planted import BACKWARD_MUTANTS, MUTANTS, SOURCES, Mutant
from .runtime import BACKEND_NAME

__all__ = ["MutantSourceError", "known_mutants", "load_mutant", "mutant_names", "mutant_source"]

_KERNEL_FILE = SOURCES["forward"]
# The line of the forward module that a backward mutant's copy redirects to the edited backward module.
_BACKWARD_IMPORT = "from .backward import triton_attention_backward"


class MutantSourceError(FlashcheckError, RuntimeError):
    """A mutant's edit no longer matches the kernel source exactly once (the kernel was changed)."""


_BY_NAME = {m.name: m for m in TRITON}

_LOCK = threading.Lock()
_CACHE_DIR: Path | None = None
_MODULES: dict = {}


def mutant_names(*, backward: bool = False) -> tuple[str, ...]:
    """The names of the planted-bug variants of the forward pass (:data:`MUTANTS` order), or of the
    backward pass (:data:`BACKWARD_MUTANTS`)."""
    return tuple(m.name for m in (BACKWARD_MUTANTS if backward else MUTANTS))


def known_mutants() -> tuple[str, ...]:
    """Every name :func:`load_mutant` takes (``flashcheck:triton~NAME``): the forward's and the backward's
    planted bugs, those of the attention variants and those of long sequences."""
    return tuple(_BY_NAME)


def _mutant(name: str) -> Mutant:
    mutant = _BY_NAME.get(name) if isinstance(name, str) else None
    if mutant is None:
        raise InvalidArgument("name", name, "unknown mutant", f"Known mutants: {', '.join(_BY_NAME)}.")
    return mutant


def _apply(mutant: Mutant, source: str) -> str:
    for old, new in mutant.edits:
        count = source.count(old)
        if count != 1:
            raise MutantSourceError(
                f"mutant {mutant.name!r}: its edit expects {old!r} exactly once in {mutant.file.name}, "
                f"found it {count} times. The kernel source changed; update the mutant's edit in "
                "flashcheck/kernels/triton/planted.py (or planted_variants.py, planted_long.py, planted_defects.py) "
                "to match it."
            )
        source = source.replace(old, new)
    return source


def mutant_source(name: str) -> str:
    """The source of the mutant's file (``forward.py`` or ``backward.py``) with its edits applied."""
    mutant = _mutant(name)
    header = f"# flashcheck mutant {mutant.name!r} ({mutant.area}): {mutant.description}\n"
    return header + _apply(mutant, mutant.file.read_text(encoding="utf-8"))


def _cache_dir() -> Path:
    global _CACHE_DIR
    if _CACHE_DIR is None:
        _CACHE_DIR = Path(tempfile.mkdtemp(prefix="flashcheck-mutants-"))
        # The files must outlive every import (Triton reads a jitted function's source with inspect).
        atexit.register(shutil.rmtree, _CACHE_DIR, True)
    return _CACHE_DIR


def _import(stem: str, source: str):
    """``source`` imported as ``flashcheck.kernels.triton.<stem>`` from a file of the private directory."""
    path = _cache_dir() / f"{stem}.py"
    path.write_text(source, encoding="utf-8")
    module_name = f"{__package__}.{stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    module.__package__ = __package__  # so `from ...errors import ...` resolves
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _module(name: str):
    """The module whose ``make_kernel`` builds mutant ``name``'s kernel."""
    with _LOCK:
        module = _MODULES.get(name)
        if module is not None:
            return module
        mutant = _mutant(name)
        stem = f"_mutant_{name}"
        if mutant.target == "forward":
            module = _import(stem, mutant_source(name))
        else:  # the edited backward, and a copy of the forward whose autograd backward calls it
            _import(stem, mutant_source(name))
            forward = _KERNEL_FILE.read_text(encoding="utf-8")
            if forward.count(_BACKWARD_IMPORT) != 1:
                raise MutantSourceError(f"{_KERNEL_FILE.name} no longer imports the backward with "
                                        f"{_BACKWARD_IMPORT!r}; update flashcheck/mutants.py to match it.")
            redirected = forward.replace(_BACKWARD_IMPORT, f"from .{stem} import triton_attention_backward")
            module = _import(f"{stem}_forward", redirected)
        _MODULES[name] = module
        return module


def load_mutant(name: str, *, block_m: int = 64, block_n: int = 64, num_warps: int | None = None,
                num_stages: int | None = None, input_precision: str = "tf32", alibi: str = "symmetric") -> Kernel:
    """The kernel of mutant ``name`` with these tile options, under the correct kernel's spec.

    Named ``flashcheck:triton~<name>[block_m=..,block_n=..]``. On CPU tensors it runs under the
    Triton interpreter, which needs ``TRITON_INTERPRET=1`` set before the mutant's first call.
    """
    _mutant(name)
    options = dict(block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                   input_precision=input_precision, alibi=alibi)
    correct = triton_flash.make_kernel(**options)  # validates the options and gives the promised spec
    made = _module(name).make_kernel(**options)
    base = BACKEND_NAME
    label = correct.name.replace(base, f"{base}~{name}", 1)
    return Kernel(made.fn, correct.spec, name=label)
