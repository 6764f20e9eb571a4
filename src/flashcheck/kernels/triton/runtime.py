"""Triton itself, imported on first use by the forward and the backward kernel alike (neither imports the
other to reach it): nothing in flashcheck imports triton before a Triton kernel runs, since Triton
decides between compiling and interpreting from ``TRITON_INTERPRET`` when a kernel is jitted.

Also the one rule on what the Triton interpreter (every Triton kernel on the CPU) computes wrongly,
:func:`left_out`: every Triton kernel's spec, flashcheck's and fla-core's, leaves those dtypes out on the CPU
(:func:`triton_dtypes`), and the registry says why.
"""

from __future__ import annotations

from ...contract.formats import DTYPES
from ...errors import BackendUnavailable

__all__ = ["BACKEND_NAME", "INTERPRETER_WRONG_DTYPES", "import_triton", "left_out", "triton_dtypes"]

BACKEND_NAME = "flashcheck:triton"
# Dtypes the Triton interpreter computes wrongly, with why: no Triton kernel claims them on the CPU.
INTERPRETER_WRONG_DTYPES = {"bf16": "the Triton interpreter's bf16 tl.dot is wrong (it computes on raw bit patterns)"}


def left_out(device: str, dtype: str) -> str | None:
    """Why a Triton kernel does not claim ``dtype`` on ``device`` (on the CPU, where the Triton interpreter runs
    it, :data:`INTERPRETER_WRONG_DTYPES`); None when it does."""
    return INTERPRETER_WRONG_DTYPES.get(dtype) if device == "cpu" else None


def triton_dtypes(device: str, dtypes: tuple = DTYPES) -> tuple:
    """The ``dtypes`` a Triton kernel claims on ``device``: those not :func:`left_out` there."""
    return tuple(d for d in dtypes if left_out(device, d) is None)


def import_triton():
    """``(triton, triton.language)``, or :class:`BackendUnavailable` when triton cannot be imported."""
    try:
        import triton  # lazy: nothing imports triton before a Triton kernel runs
        import triton.language as tl
    except ImportError as exc:
        raise BackendUnavailable(
            BACKEND_NAME, "any", f"triton cannot be imported ({exc})",
            "Install triton (pip install 'flashcheck[cpu]' for the CPU interpreter).",
        ) from exc
    return triton, tl
