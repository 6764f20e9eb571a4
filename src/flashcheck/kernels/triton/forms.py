"""flashcheck's Triton kernels of the serving forms, by name: the module and function that make each, and what
it is. Nothing here imports triton until a kernel is made (the registry lists the names without it)."""

from __future__ import annotations

import importlib

__all__ = ["TRITON_FORMS", "make_triton_form"]

_INTERPRETED = "on the CPU under the Triton interpreter"
# name -> (module under flashcheck.kernels.triton, its factory, description)
TRITON_FORMS = {
    "flashcheck:triton-varlen": ("varlen", "make_varlen_kernel", "flashcheck's own Triton kernel over packed varlen "
                                 f"batches ({_INTERPRETED})"),
    "flashcheck:triton-paged": ("paged", "make_paged_kernel", "flashcheck's own Triton kernel over a paged KV cache "
                                f"with a block table, any page size ({_INTERPRETED})"),
    "flashcheck:triton-split-kv": ("split_kv", "make_split_kv_kernel", "flashcheck's own Triton split-KV decoding "
                                   "over a paged cache: partial states, then a Triton merge; judged at 1, 2, 3, 16 "
                                   f"and 32 splits ({_INTERPRETED})"),
}


def make_triton_form(name: str, *, device: str, mutant: str | None = None):
    """The :class:`~flashcheck.contract.spec.Kernel` ``name`` of :data:`TRITON_FORMS` (its planted bug ``mutant``)."""
    module, factory, _ = TRITON_FORMS[name]
    return getattr(importlib.import_module(f"{__package__}.{module}"), factory)(device=device, mutant=mutant)
