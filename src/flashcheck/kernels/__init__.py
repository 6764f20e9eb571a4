"""Kernels under test: the registry that resolves a name (:mod:`.registry`) through the table of built-ins
(:mod:`.builtins`) and their planted bugs (:mod:`.planted`), PyTorch's SDPA backends and FlexAttention, adapters
for other calling conventions, and flashcheck's own Triton kernel (:mod:`.triton`).

``from flashcheck.kernels import resolve_kernel`` reaches the registry; importing this package imports
neither torch nor triton until a registry name is used.
"""

from __future__ import annotations

_REGISTRY_NAMES = ("BUILTIN_KERNELS", "DEVICES", "available_kernels", "resolve_kernel")
__all__ = list(_REGISTRY_NAMES)


def __getattr__(name: str):
    if name in _REGISTRY_NAMES:
        from . import registry  # lazy (PEP 562): the registry imports torch

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
