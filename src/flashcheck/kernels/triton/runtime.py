"""Triton itself, imported on first use by the forward and the backward kernel alike (neither imports the
other to reach it): nothing in flashcheck imports triton before a Triton kernel runs, since Triton
decides between compiling and interpreting from ``TRITON_INTERPRET`` when a kernel is jitted."""

from __future__ import annotations

from ...errors import BackendUnavailable

__all__ = ["BACKEND_NAME", "import_triton"]

BACKEND_NAME = "flashcheck:triton"


def import_triton():
    """``(triton, triton.language)``, or :class:`BackendUnavailable` when triton cannot be imported."""
    try:
        import triton
        import triton.language as tl
    except ImportError as exc:
        raise BackendUnavailable(
            BACKEND_NAME, "any", f"triton cannot be imported ({exc})",
            "Install triton (pip install 'flashcheck[cpu]' for the CPU interpreter).",
        ) from exc
    return triton, tl
