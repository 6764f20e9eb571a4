"""The self-test's subjects: flashcheck:triton's correct kernel at several tile shapes, PyTorch's backends, and
flashcheck:triton's planted bugs (the catalog's :data:`~flashcheck.kernels.planted.SELFTEST` and
:data:`~flashcheck.kernels.planted.SELFTEST_BACKWARD`, with their descriptions), then the built-in references of
:data:`~flashcheck.kernels.planted.SELFTEST_BUILTINS` with their planted bugs (``torch:mla~NAME``), each a
:class:`Subject` that
:mod:`flashcheck.selftest.run` judges row by row (a subject, not a :class:`flashcheck.Variant`, which is what a
case asks beyond plain attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..contract.formats import DTYPES
from ..contract.spec import Kernel
from ..features.variant import FEATURES
from ..kernels.planted import SELFTEST, SELFTEST_BACKWARD, SELFTEST_BUILTINS
from ..kernels.registry import BUILTIN_KERNELS, resolve_kernel
from ..kernels.triton.forward import make_kernel, on_device
from ..kernels.triton.mutants import load_mutant

__all__ = ["CORRECT_TILES", "MUTANT_TILE", "Subject", "subjects"]

CORRECT_TILES = ((16, 16), (32, 64), (64, 32), (64, 64))
MUTANT_TILE = (32, 32)


@dataclass
class Subject:
    """A kernel the self-test judges: correct (no alarm allowed) or a planted bug (to be caught)."""

    name: str
    correct: bool
    area: str
    description: str
    make: Callable[[], Kernel]
    dtypes: tuple = DTYPES  # where a planted bug is a defect at all
    features: tuple = ()  # the attention variants its cases draw (a planted bug's own and those it needs)


def subjects(device: str, *, names: list[str] | None = None, which: str = "all",
             backward: bool = False) -> list[Subject]:
    """The correct kernels (four tile shapes, PyTorch's backends) and the planted bugs (of the backward
    pass with ``backward``, those whose defect can show on ``device``).

    ``which``: ``"all"``, ``"correct"`` or ``"bugs"``; ``names`` keeps only the subjects named.
    """
    # The interpreter computes fp32 dots in IEEE fp32, so on the CPU the kernels declare (and are held
    # to) the strict contract; on a GPU they run as tf32 under the flash contract.
    precision = "ieee" if device == "cpu" else "tf32"
    out = [Subject(f"triton[{m}x{n}]", True, "correct", f"flashcheck:triton, BLOCK_M={m}, BLOCK_N={n}",
                   lambda m=m, n=n: on_device(make_kernel(block_m=m, block_n=n, input_precision=precision), device))
           for m, n in CORRECT_TILES]
    m, n = MUTANT_TILE
    out.append(Subject(f"triton[{m}x{n}] variants", True, "correct",
                       f"flashcheck:triton, BLOCK_M={m}, BLOCK_N={n}, on cases of each feature ({', '.join(FEATURES)})",
                       lambda: on_device(make_kernel(block_m=m, block_n=n, input_precision=precision), device),
                       features=FEATURES))
    # PyTorch's fused backward kernels have defects of their own (reports/results.md, "Defects found"): campaigns
    # judge them; they are not rows that must stay clean here.
    torch_backends = ["torch:math"] + (["torch:flash", "torch:efficient"] if device == "cuda" and not backward else [])
    out += [Subject(name, True, "correct", f"PyTorch SDPA, {name}", lambda name=name: resolve_kernel(name, device=device))
            for name in torch_backends]
    out += [Subject(m.name, False, m.area, m.description,
                    lambda m=m: on_device(load_mutant(
                        m.name, block_m=MUTANT_TILE[0], block_n=MUTANT_TILE[1], input_precision=precision), device),
                    dtypes=m.dtypes, features=(m.area,) + m.features if m.area in FEATURES else ())
            for m in (SELFTEST_BACKWARD if backward else SELFTEST) if device in m.devices]
    out += [] if backward else _builtin_subjects(device)
    return [v for v in out if (which == "all" or v.correct == (which == "correct"))
            and (names is None or v.name in names)]


def _builtin_subjects(device: str) -> list[Subject]:
    """The built-in references of :data:`~flashcheck.kernels.planted.SELFTEST_BUILTINS`, each correct and with its
    planted bugs, after flashcheck:triton's rows (so that those keep their order)."""
    out = []
    for name, bugs in SELFTEST_BUILTINS.items():
        out.append(Subject(name, True, "correct", BUILTIN_KERNELS[name],
                           lambda name=name: resolve_kernel(name, device=device)))
        out += [Subject(f"{name}~{bug.name}", False, name, bug.description,
                        lambda target=f"{name}~{bug.name}": resolve_kernel(target, device=device)) for bug in bugs]
    return out
