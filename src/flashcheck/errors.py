"""flashcheck's exceptions.

Every error raised for bad input names the argument, echoes its value and says how to fix it,
so a user never has to read flashcheck's source to understand a refusal.
"""

from __future__ import annotations

__all__ = [
    "FlashcheckError",
    "InvalidArgument",
    "BackendUnavailable",
    "Unsupported",
    "CaseFormatError",
    "describe",
    "sentences",
]


class FlashcheckError(Exception):
    """Base class of every error flashcheck raises on purpose."""


def describe(value: object) -> str:
    """A short, faithful rendering of ``value`` for an error message.

    Tensors and arrays are described by shape, dtype, device and strides rather than printed,
    since their contents would drown the message.
    """
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is not None and dtype is not None:
        kind = type(value).__name__
        parts = [f"shape={tuple(shape)}", f"dtype={dtype}"]
        device = getattr(value, "device", None)
        if device is not None:
            parts.append(f"device={device}")
        stride = getattr(value, "stride", None)
        if callable(stride):
            parts.append(f"stride={tuple(stride())}")
        return f"{kind}({', '.join(parts)})"
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _sentence(text: str) -> str:
    """``text`` ending with one full stop: none is added after one (or after "!" or "?"), as when the text
    ends with another error's own message ("RuntimeError: needs a GPU.")."""
    text = text.rstrip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def sentences(problem: str, fix: str = "") -> str:
    """An error message: the problem as one sentence, then the fix, when there is one. Every message that
    joins a problem and a fix joins them here."""
    return f"{_sentence(problem)} {fix}" if fix else _sentence(problem)


class InvalidArgument(FlashcheckError, ValueError):
    """An argument to a public function is not acceptable.

    The message reads ``name=value: problem. fix`` so it can be acted on directly.
    """

    def __init__(self, name: str, value: object, problem: str, fix: str):
        self.argument = name
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(sentences(f"{name}={describe(value)}: {problem}", fix))


class BackendUnavailable(FlashcheckError, RuntimeError):
    """A kernel backend exists but cannot run here (no GPU, no such SDPA backend, ...)."""

    def __init__(self, backend: str, device: str, reason: str, fix: str = ""):
        self.backend = backend
        self.device = device
        self.reason = reason
        self.fix = fix
        super().__init__(sentences(f"kernel {backend!r} cannot run on device {device!r}: {reason}", fix))


class Unsupported(FlashcheckError):
    """Raised by a kernel for an input it does not handle and its spec cannot express.

    A spec declares most limits (dtypes, head dims, lengths), so that strategies never draw what a
    kernel refuses; some limits show only at call time (a fused backend that refuses one key, or a
    combination of options no spec field describes). ``raise flashcheck.Unsupported("why")`` from the
    kernel says "outside what I do, not a defect": :func:`flashcheck.check` skips the case, with
    ``verdict.skipped == "unsupported: why"``, and a campaign counts the skip instead of a finding.
    Any other exception a kernel raises is a crash, judged as a BUG.
    """

    def __init__(self, reason: str):
        self.reason = str(reason)
        super().__init__(self.reason)


class CaseFormatError(FlashcheckError, ValueError):
    """A saved case on disk is missing, truncated or inconsistent."""

    def __init__(self, path: object, problem: str, fix: str = ""):
        self.path = path
        super().__init__(sentences(f"saved case {str(path)!r}: {problem}", fix))
