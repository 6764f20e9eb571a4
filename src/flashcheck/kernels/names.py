"""Kernel names and import paths: ``NAME~BUG[key=value,...]`` split into its parts, and
``package.module:function`` imported as a :class:`~flashcheck.contract.spec.Kernel`, each refusal saying
which part is wrong."""

from __future__ import annotations

import importlib
import re

from ..contract.spec import Kernel, as_kernel
from ..errors import InvalidArgument

__all__ = ["dotted", "import_target", "parse_kernel_name"]


def dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


def _public_callables(obj) -> str:
    names = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))
    if not names:
        return "no public callables"
    return ", ".join(names[:12]) + (", ..." if len(names) > 12 else "")


def import_target(target: str) -> Kernel:
    module_name, _, attr_path = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module_name or module_name.startswith(missing + "."):
            problem = f"module {module_name!r} not found"
            if missing != module_name:
                problem += f" (no module named {missing!r})"
            raise InvalidArgument("kernel", target, problem,
                                  "Check the part before the colon: it must be an importable module "
                                  "(installed, or on sys.path).") from exc
        fix = f"Install {missing!r} or fix that module's imports." if missing else "Fix that module's imports."
        raise InvalidArgument("kernel", target, f"module {module_name!r} was found but importing it failed: {exc}",
                              fix) from exc
    except Exception as exc:
        raise InvalidArgument("kernel", target,
                              f"importing module {module_name!r} raised {type(exc).__name__}: {exc}",
                              "Fix the error in that module.") from exc
    obj = module
    parts = attr_path.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            where = module_name if i == 0 else f"{module_name}:{'.'.join(parts[:i])}"
            raise InvalidArgument("kernel", target, f"module {module_name!r} was imported, but attribute {part!r} "
                                  f"was not found in {where!r}",
                                  f"Check the part after the colon; {where} has {_public_callables(obj)}.") from None
    if isinstance(obj, Kernel):
        return obj
    if not callable(obj):
        raise InvalidArgument("kernel", target, f"{attr_path!r} is a {type(obj).__name__}, not a callable",
                              "Point the import path at a kernel function "
                              "kernel(q, k, v, *, scale, causal, attn_mask=None).")
    return as_kernel(obj, name=target)


_NAME_WITH_OPTIONS = re.compile(r"^(?P<base>[^\[~]+)(?:~(?P<mutant>\w+))?(?:\[(?P<options>[^\]]*)\])?$")


def _option_value(text: str):
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    return {"True": True, "False": False, "None": None}.get(text, text)


def parse_kernel_name(name: str) -> tuple[str, str | None, dict]:
    """``"flashcheck:triton~mutant[block_m=32,block_n=32]"`` -> (base, mutant, options).

    Names of this form are what flashcheck:triton's kernels (and their planted-bug variants) call
    themselves, so a saved case's kernel name resolves back to the same kernel.
    """
    match = _NAME_WITH_OPTIONS.match(name)
    if not match:
        return name, None, {}
    options = {}
    for item in filter(None, (match["options"] or "").split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise InvalidArgument("kernel", name, f"option {item!r} has no value",
                                  "Write options as NAME[key=value,...], e.g. flashcheck:triton[block_m=32].")
        options[key.strip()] = _option_value(value.strip())
    return match["base"], match["mutant"], options
