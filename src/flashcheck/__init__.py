"""flashcheck: numerical property testing for tiled ("flash") attention kernels.

The public names below are imported on first use (PEP 562): ``import flashcheck`` (and ``import
flashcheck.cli``) costs no torch import, so that ``flashcheck fuzz`` can start its kernel worker process
before this process imports torch, and the two imports overlap. ``from flashcheck import check``,
``flashcheck.check(...)`` and ``from flashcheck import *`` work as ever.
"""

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"

# public name -> (submodule, its attribute). A new public name goes here and in __all__, never in an
# import at the top: importing flashcheck must not import torch (tests/unit/test_imports.py).
_PUBLIC = {
    "AttentionCase": ("inputs.case", "AttentionCase"),
    "ServingCase": ("inputs.serving", "ServingCase"),
    "BackendUnavailable": ("errors", "BackendUnavailable"),
    "CaseFormatError": ("errors", "CaseFormatError"),
    "FlashcheckError": ("errors", "FlashcheckError"),
    "InvalidArgument": ("errors", "InvalidArgument"),
    "Unsupported": ("errors", "Unsupported"),
    "assert_attention_close": ("judge.check", "assert_attention_close"),
    "check": ("judge.check", "check"),
    "check_backward": ("judge.backward", "check_backward"),
    "check_merge": ("judge.merge", "check_merge"),
    "Gradients": ("numerics.gradients", "Gradients"),
    "audit_gradients": ("numerics.gradients", "audit_gradients"),
    "reference_gradients": ("numerics.gradients", "reference_gradients"),
    "Reference": ("numerics.oracle", "Reference"),
    "audit_reference": ("numerics.audit", "audit_reference"),
    "reference_attention": ("numerics.oracle", "reference_attention"),
    "PRECISIONS": ("contract.precision", "PRESETS"),
    "Precision": ("contract.precision", "Precision"),
    "Kernel": ("contract.spec", "Kernel"),
    "KernelSpec": ("contract.spec", "KernelSpec"),
    "kernel": ("contract.spec", "kernel"),
    "KeySets": ("contract.key_sets", "KeySets"),
    "BlockSparse": ("contract.block_sparse", "BlockSparse"),
    "BlockLists": ("features.block_lists", "BlockLists"),
    "LatentCache": ("contract.mla", "LatentCache"),
    "Variant": ("features.variant", "Variant"),
    "BUG": ("judge.verdict", "BUG"),
    "PASS": ("judge.verdict", "PASS"),
    "SUSPICIOUS": ("judge.verdict", "SUSPICIOUS"),
    "Finding": ("judge.verdict", "Finding"),
    "Verdict": ("judge.verdict", "Verdict"),
    "assert_passes": ("testing.asserts", "assert_passes"),
    "property_test": ("testing.property_test", "property_test"),
}

__all__ = [
    "BUG",
    "PASS",
    "PRECISIONS",
    "SUSPICIOUS",
    "AttentionCase",
    "ServingCase",
    "Finding",
    "Verdict",
    "assert_attention_close",
    "audit_reference",
    "check",
    "check_backward",
    "check_merge",
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
    "KeySets",
    "BlockSparse",
    "BlockLists",
    "LatentCache",
    "Precision",
    "Variant",
    "Reference",
    "reference_attention",
    "kernel",
    "assert_passes",
    "property_test",
]


# Submodules users reach by their old, short names: ``flashcheck.strategies.cases(...)`` after ``import
# flashcheck``, and ``from flashcheck.strategies import cases``, give the module where it lives now.
SUBMODULES = {
    "strategies": "inputs.recipe_draws", "regimes": "inputs.regimes", "presets": "inputs.presets",
    "masks": "contract.masks", "twin": "numerics.twin", "budget": "numerics.budget", "oracle": "numerics.oracle",
    "anchors": "judge.anchors", "mutants": "kernels.triton.mutants",
}


def __getattr__(name: str):
    if name in SUBMODULES:
        value = importlib.import_module(f"{__name__}.{SUBMODULES[name]}")
        globals()[name] = value
        return value
    try:
        module, attribute = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


class _ShortNames(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import flashcheck.strategies`` loads ``flashcheck.inputs.recipe_draws`` and gives that very module."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __name__ and name in SUBMODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{SUBMODULES[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        pass  # the module ran when it was imported under its own name


sys.meta_path.append(_ShortNames())
