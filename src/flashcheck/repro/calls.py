"""How a reproducer calls the kernel: which call of the script (:mod:`flashcheck.repro._script`) a kernel gets, and
the data it needs, or a refusal for a kernel that plain public code cannot call.

- A plain callable (``module:function``, also under ``@flashcheck.kernel``): the script imports the function
  underneath the decorator and calls it with the calling convention's arguments, as flashcheck's check does.
- ``torch:math``, ``torch:flash``, ``torch:efficient``, ``torch:cudnn``: ``scaled_dot_product_attention`` under
  ``sdpa_kernel(SDPBackend.X)``, with the mask, GQA and layout handling of :mod:`flashcheck.kernels.sdpa`.
- ``torch:flex`` (and its options): ``flex_attention`` with the block mask, score_mod and sink key of
  :mod:`flashcheck.kernels.flex`, written out in the script.

- A case of a serving form (varlen, paged; split-KV: a paged kernel whose spec has ``num_splits``): a plain callable
  of that form, called with the packed or paged tensors and the form's keywords, at each split count.

Refused: flashcheck's own kernels (``flashcheck:triton`` and its forms, the planted-bug variants ``NAME~BUG``),
fla-core's, and the built-in kernels of the serving forms (``torch:varlen``, ``torch:paged``, ``torch:split-kv``,
...)."""

from __future__ import annotations

from ..contract.forms import SERVING_FORMS
from ..contract.spec import Kernel
from ..errors import InvalidArgument
from ..features.forms import script_entries
from ..features.registry import REGISTRY, feature
from ..inputs.serving import ServingCase
from ..kernels.builtins import builtin
from ..kernels.names import parse_kernel_name
from ..kernels.origin import import_root, reserved
from ..kernels.sdpa import SDPA_KERNELS

__all__ = ["SUPPORTED", "kernel_call", "plain_target"]

FLEX = "torch:flex"
SUPPORTED = ("a plain callable module:function", *SDPA_KERNELS,
             f"{FLEX} (options {', '.join(option.name for option in builtin(FLEX).options)})")
# The features a script writes out: every one but a key restriction without a mask_mod of its own.
_SCRIPTED = [f.name for f in REGISTRY if f.term != "keys" or "mask_mod" in (f.script or {})]
_FIX = (f"flashcheck repro writes dense cases (masks; {', '.join(_SCRIPTED[:-1])} and {_SCRIPTED[-1]} where the kernel "
        f"takes them) of {', '.join(SUPPORTED)}, and {', '.join(SERVING_FORMS)} and split-KV cases of a plain callable "
        "module:function of that form. Replay the case with flashcheck replay instead.")


def _refuse(case_path, why: str):
    raise InvalidArgument("case", str(case_path), why, _FIX)


def kernel_call(kernel: Kernel, case, *, device: str, case_path) -> dict:
    """The script's ``CASE["kernel"]`` for ``kernel`` on ``case``: ``kind`` (``plain``, ``sdpa`` or ``flex``),
    ``target`` and what that call needs; InvalidArgument naming the case for a kernel or case it cannot call."""
    source = kernel.source or kernel.name
    base, mutant, options = parse_kernel_name(source)
    if mutant is not None:
        _refuse(case_path, f"its kernel {source} is one of flashcheck's planted-bug variants, not an upstream kernel")
    if len(kernel.spec.calling.arguments("q", "k", "v")) != 3:  # the scripts hand a kernel q, k and v
        _refuse(case_path, f"its kernel {source} takes one cached row for K and V, which no script calls yet")
    used = () if case is None else case.variant.used
    unscripted = [f for f in map(feature, used) if f.term == "keys" and "mask_mod" not in (f.script or {})]
    if unscripted:  # the script's reference would show keys the case hides
        _refuse(case_path, f"its {unscripted[0].title or unscripted[0].name} has no reproducer code yet")
    unweighed = [] if case is None else [f for f in case.variant.biasing()
                                         if f.term == "keys" and "weight" not in (f.script or {})]
    if unweighed:  # the script's answer would count each key once
        _refuse(case_path, f"its {unweighed[0].title or unweighed[0].name} weighs keys by how often they are listed, "
                "which its reproducer code does not count yet")
    if isinstance(case, ServingCase):
        return _serving(kernel, case, source, case_path)
    if base in SDPA_KERNELS:
        return {"kind": "sdpa", "target": base, "backend": SDPA_KERNELS[base][0],
                "repeat_kv": base == "torch:efficient",  # measured: efficient refuses enable_gqa
                "fused": base != "torch:math",
                # Only CUDA's flash and efficient kernels have a bottom-right causal mode of their own.
                "native_lower_right": device == "cuda" and base in ("torch:flash", "torch:efficient")}
    if base == FLEX:
        compiled = options.get("compile", True)
        # Its other options are settings of the variant, which the script reads from the case: they are the kernel's,
        # as flashcheck refuses to check a case whose settings the kernel's spec does not declare.
        return {"kind": "flex", "target": source, "compile": compiled,
                "returns_lse": not (compiled and device == "cpu")}  # the compiled CPU kernel returns no lse
    if reserved(base):
        _refuse(case_path, f"its kernel {source} is a built-in that plain public code cannot call")
    return plain_target(kernel, source, case_path)


def _serving(kernel: Kernel, case: ServingCase, source: str, case_path) -> dict:
    if kernel.spec.form != case.form:
        _refuse(case_path, f"a {case.form} case, but its kernel {source} declares form={kernel.spec.form!r}")
    if reserved(source):
        _refuse(case_path, f"its kernel {source} is a built-in that plain public code cannot call")
    per_query = [f for f in map(feature, case.variant.used) if f.per_query]
    if per_query:  # the serving script hands a variant's tensors in the dense layout, not laid out as q
        _refuse(case_path, f"a {case.form} case with {per_query[0].title or per_query[0].name}, which the serving "
                "script does not lay out as q yet")
    return {**plain_target(kernel, source, case_path), **script_entries(kernel.spec)}


def plain_target(kernel: Kernel, source: str, case_path) -> dict:
    """The function underneath a decorated kernel (its module may then import without flashcheck)."""
    fn = kernel.fn
    while isinstance(fn, Kernel):
        fn = fn.fn
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and qualname and "<locals>" not in qualname and module != "__main__":
        target = f"{module}:{qualname}"
    elif ":" in source:
        target = source
    else:
        _refuse(case_path, f"its kernel {source} has no import path (defined inside a function or in __main__)")
    root = import_root(target.split(":")[0])
    return {"kind": "plain", "target": target, "import_root": None if root is None else str(root)}
