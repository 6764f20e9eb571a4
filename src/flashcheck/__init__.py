"""flashcheck: numerical property testing for tiled ("flash") attention kernels.

The public names below are imported on first use (PEP 562): ``import flashcheck`` (and ``import
flashcheck.cli``) costs no torch import, so that ``flashcheck fuzz`` can start its kernel worker process
before this process imports torch, and the two imports overlap. ``from flashcheck import check``,
``flashcheck.check(...)`` and ``from flashcheck import *`` work as ever.
"""

import importlib
import sys
import types

__version__ = "0.1.0"

# public name -> (submodule, its attribute). A new public name goes here and in __all__, never in an
# import at the top: importing flashcheck must not import torch (tests/unit/test_imports.py).
_PUBLIC = {
    "AttentionCase": ("case", "AttentionCase"),
    "BackendUnavailable": ("errors", "BackendUnavailable"),
    "CaseFormatError": ("errors", "CaseFormatError"),
    "FlashcheckError": ("errors", "FlashcheckError"),
    "InvalidArgument": ("errors", "InvalidArgument"),
    "Unsupported": ("errors", "Unsupported"),
    "assert_attention_close": ("check", "assert_attention_close"),
    "check": ("check", "check"),
    "check_backward": ("backward", "check_backward"),
    "Gradients": ("gradients", "Gradients"),
    "audit_gradients": ("gradients", "audit_gradients"),
    "reference_gradients": ("gradients", "reference_gradients"),
    "Reference": ("oracle", "Reference"),
    "audit_reference": ("oracle", "audit_reference"),
    "reference_attention": ("oracle", "reference_attention"),
    "PRECISIONS": ("precision", "PRESETS"),
    "Precision": ("precision", "Precision"),
    "Kernel": ("spec", "Kernel"),
    "KernelSpec": ("spec", "KernelSpec"),
    "kernel": ("spec", "kernel"),
    "BUG": ("verdict", "BUG"),
    "PASS": ("verdict", "PASS"),
    "SUSPICIOUS": ("verdict", "SUSPICIOUS"),
    "Finding": ("verdict", "Finding"),
    "Verdict": ("verdict", "Verdict"),
    "assert_passes": ("testing", "assert_passes"),
    "property_test": ("testing", "property_test"),
}

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
    "check_backward",
    "Gradients",
    "audit_gradients",
    "reference_gradients",
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
    "assert_passes",
    "property_test",
]


# Submodules users reach as attributes, e.g. ``flashcheck.strategies.cases(...)`` after ``import flashcheck``.
_SUBMODULES = ("strategies", "masks", "regimes", "presets", "twin", "budget", "oracle", "anchors", "mutants")


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = value
        return value
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(__import__(f"{__name__}.{module}", fromlist=[attribute]), attribute)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """``flashcheck.check`` is the function, as it was when this package imported its names eagerly:
    importing the submodule ``flashcheck.check`` sets the package's attribute to the module, and here it
    is set to the submodule's function of that name instead."""

    def __setattr__(self, name, value):
        if isinstance(value, types.ModuleType) and value.__name__ == f"{__name__}.{name}" and name in _PUBLIC:
            value = getattr(value, _PUBLIC[name][1])
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
