"""flashcheck: numerical property testing for tiled ("flash") attention kernels."""

from .case import AttentionCase
from .errors import BackendUnavailable, CaseFormatError, FlashcheckError, InvalidArgument, Unsupported
from .check import assert_attention_close, check
from .oracle import Reference, audit_reference, reference_attention
from .precision import PRESETS as PRECISIONS
from .precision import Precision
from .spec import Kernel, KernelSpec, kernel
from .verdict import BUG, PASS, SUSPICIOUS, Finding, Verdict

__version__ = "0.1.0"

__all__ = [
    "BUG",
    "PASS",
    "PRECISIONS",
    "SUSPICIOUS",
    "AttentionCase",
    "Finding",
    "Verdict",
    "assert_attention_close",
    "audit_reference",
    "check",
    "BackendUnavailable",
    "CaseFormatError",
    "FlashcheckError",
    "InvalidArgument",
    "Unsupported",
    "Kernel",
    "KernelSpec",
    "Precision",
    "Reference",
    "reference_attention",
    "kernel",
]
