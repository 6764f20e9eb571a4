"""flashcheck: numerical property testing for tiled ("flash") attention kernels."""

from .errors import BackendUnavailable, CaseFormatError, FlashcheckError, InvalidArgument
from .oracle import Reference, reference_attention
from .precision import Precision
from .spec import Kernel, KernelSpec, kernel

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailable",
    "CaseFormatError",
    "FlashcheckError",
    "InvalidArgument",
    "Kernel",
    "KernelSpec",
    "Precision",
    "Reference",
    "reference_attention",
    "kernel",
]
