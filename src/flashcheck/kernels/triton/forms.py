"""flashcheck's Triton kernels of the serving forms, by name: the module and function that make each, its
planted bugs and what it is. Nothing here imports triton until a kernel is made (the registry lists the names,
and ``flashcheck kernels`` their planted bugs, without it)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from ..serving import SERVING_MUTANTS
from ..split_kv import SPLIT_MUTANTS

__all__ = ["PAGED_MUTANTS", "TRITON_FORMS", "TritonForm", "VARLEN_MUTANTS", "make_triton_form"]

# Planted bugs (name -> what it does wrong); the paged kernel's are torch:paged's.
VARLEN_MUTANTS = {"reads_past_end": "every sequence also attends the key just past its end"}
PAGED_MUTANTS = {name: what for name, (form, what) in SERVING_MUTANTS.items() if form == "paged"}


@dataclass(frozen=True)
class TritonForm:
    module: str       # under flashcheck.kernels.triton
    factory: str      # the module's function that makes the kernel
    mutants: dict     # its planted bugs: name -> what it does wrong
    description: str


_INTERPRETED = "on the CPU under the Triton interpreter"
TRITON_FORMS = {
    "flashcheck:triton-varlen": TritonForm("varlen", "make_varlen_kernel", VARLEN_MUTANTS,
                                           "flashcheck's own Triton kernel over packed varlen batches "
                                           f"({_INTERPRETED})"),
    "flashcheck:triton-paged": TritonForm("paged", "make_paged_kernel", PAGED_MUTANTS,
                                          "flashcheck's own Triton kernel over a paged KV cache with a block table, "
                                          f"any page size ({_INTERPRETED})"),
    "flashcheck:triton-split-kv": TritonForm("split_kv", "make_split_kv_kernel", SPLIT_MUTANTS,
                                             "flashcheck's own Triton split-KV decoding over a paged cache: partial "
                                             "states, then a Triton merge; judged at 1, 2, 3, 16 and 32 splits "
                                             f"({_INTERPRETED})"),
}


def _module(name: str):
    return importlib.import_module(f"{__package__}.{TRITON_FORMS[name].module}")  # imports no triton


def make_triton_form(name: str, *, device: str, mutant: str | None = None):
    """The :class:`~flashcheck.contract.spec.Kernel` ``name`` of :data:`TRITON_FORMS` (its planted bug ``mutant``)."""
    return getattr(_module(name), TRITON_FORMS[name].factory)(device=device, mutant=mutant)

