"""The kernel registry: from a name, an import path or a callable to a :class:`~flashcheck.contract.spec.Kernel`.

``resolve_kernel(target, device=..., **options)`` accepts

- a built-in name (:data:`BUILTIN_KERNELS`, the table of :mod:`.builtins`): ``torch:math``, ``torch:flash``,
  ``torch:efficient``, ``torch:cudnn`` (PyTorch SDPA with that one backend forced), ``torch:flex``
  (FlexAttention), ``flashcheck:triton`` (the project's Triton kernel; tile sizes as options), ...; with its
  options ``NAME[key=value,...]`` and one of its planted bugs ``NAME~BUG``;
- an import path ``package.module:function`` (``function`` may be dotted: ``module:Class.method``)
  naming a :class:`Kernel` or a plain callable, which gets the conservative default spec;
- a :class:`Kernel` or a callable passed directly.

Every refusal names the backend, the device and the reason: :class:`BackendUnavailable` when a
kernel cannot run here, :class:`InvalidArgument` for a bad name, path, option or planted bug; a usage error is
reported before any availability check, so the same on every machine.

Nothing here imports triton. Resolving any kernel applies ``$FLASHCHECK_TRITON_CACHE`` (see
:mod:`flashcheck.kernels.triton.cache`).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..contract.formats import DEVICES
from ..contract.spec import Kernel, as_kernel
from ..errors import BackendUnavailable, InvalidArgument
from .builtins import BUILTINS, Builtin, builtin
from .names import dotted, import_target, parse_kernel_name
from .origin import reserved
from .triton.cache import use_triton_cache
from .triton.runtime import BACKEND_NAME as TRITON
from .triton.runtime import left_out

__all__ = ["BUILTIN_KERNELS", "DEVICES", "available_kernels", "kernel_options", "parse_kernel_name", "planted_bugs",
           "resolve_kernel"]

BUILTIN_KERNELS: dict[str, str] = {entry.name: entry.description for entry in BUILTINS}


def _device_type(device) -> str:
    try:
        kind = torch.device(device).type if isinstance(device, (str, torch.device)) else None
    except (RuntimeError, TypeError):
        kind = None
    if kind not in DEVICES:
        raise InvalidArgument("device", device, "flashcheck runs kernels on CUDA or on the CPU",
                              "Pass device='cuda' or device='cpu'.")
    return kind


def _builtin_list() -> str:
    return ", ".join(BUILTIN_KERNELS)


# ------------------------------------------------------------------------------------------------
# Options and planted bugs: what a built-in's name may add, checked against its entry
# ------------------------------------------------------------------------------------------------


def kernel_options(name: str) -> tuple[str, ...]:
    """The options the built-in ``name`` takes (``name[option=value]``), as its factory declares them."""
    entry = builtin(name)
    return tuple(option.name for option in entry.options) if entry else ()


def planted_bugs(name: str) -> tuple[str, ...]:
    """The planted bugs of the built-in ``name`` (``name~BUG``), as resolving checks a name against them."""
    entry = builtin(name)
    return tuple(bug.name for bug in entry.planted) if entry else ()


def _check_options(entry: Builtin, options: dict) -> None:
    valid = kernel_options(entry.name)
    for option, value in options.items():
        if option not in valid:
            fix = f"Options of {entry.name}: {', '.join(valid)}." if valid else f"{entry.name} takes no options."
            raise InvalidArgument(option, value, f"not an option of kernel {entry.name!r}", fix)


def _check_planted(target: str, entry: Builtin, mutant: str | None) -> None:
    if mutant is None:
        return
    names = planted_bugs(entry.name)
    if not names:
        having = [e.name for e in BUILTINS if e.planted]
        raise InvalidArgument("kernel", target, f"planted-bug variants exist for {', '.join(having)} only",
                              "`flashcheck kernels` lists each kernel's planted bugs (KERNEL~NAME).")
    if mutant not in names:
        raise InvalidArgument("kernel", f"{entry.name}~{mutant}", f"no planted bug {mutant!r} for {entry.name}",
                              f"Planted bugs of {entry.name}: {sorted(names)}.")


def dtype_left_out(kernel: Kernel, device: str, dtype: str) -> str | None:
    """Why a built-in kernel's spec leaves ``dtype`` out on ``device`` although the kernel has it
    (flashcheck:triton under the Triton interpreter); None when it does not."""
    device = _device_type(device)
    return left_out(device, dtype) if parse_kernel_name(kernel.source or "")[0] == TRITON else None


# ------------------------------------------------------------------------------------------------
# Built-ins
# ------------------------------------------------------------------------------------------------


def _make(target: str, entry: Builtin, device: str, options: dict, mutant: str | None = None) -> Kernel:
    """The built-in ``entry`` (with its planted bug ``mutant``): its options and planted bug checked first."""
    _check_planted(target, entry, mutant)
    _check_options(entry, options)
    kernel = entry.make(device=device, **options, **({} if mutant is None else {"mutant": mutant}))
    # A built-in's name holds its options (flashcheck:triton[block_m=32,block_n=64]): it resolves back.
    return kernel.reached_as(kernel.name)


def _why_unavailable(entry: Builtin, device: str) -> BackendUnavailable | None:
    """Side-effect-free availability check of a built-in (never sets TRITON_INTERPRET)."""
    if entry.unavailable is not None:
        return entry.unavailable(device)
    try:
        entry.make(device=device)
    except BackendUnavailable as exc:
        return exc
    return None


def available_kernels(device: str = "cuda") -> tuple:
    """The built-in kernel names that can run on ``device`` (``"cuda"`` or ``"cpu"``) here."""
    device = _device_type(device)
    return tuple(entry.name for entry in BUILTINS if _why_unavailable(entry, device) is None)


# ------------------------------------------------------------------------------------------------
# resolve_kernel
# ------------------------------------------------------------------------------------------------


def _builtin(target: str, device: str, options: dict) -> Kernel | None:
    """The built-in ``target`` names (``NAME``, ``NAME~BUG``, ``NAME[key=value,...]``), or None if it names none."""
    base, mutant, named = parse_kernel_name(target)
    entry = builtin(base)
    if entry is None or (target != base and not (named or mutant)):
        return None
    return _make(target, entry, device, {**named, **options}, mutant)


def _import_path(target: str) -> Kernel:
    module_name, colon, attr_path = target.partition(":")
    if reserved(target):
        raise InvalidArgument("kernel", target, "unknown built-in kernel", f"Built-in kernels: {_builtin_list()}.")
    if not (colon and dotted(module_name) and dotted(attr_path)):
        raise InvalidArgument("kernel", target, "neither a built-in kernel name nor an import path",
                              f"Use a built-in ({_builtin_list()}) or 'package.module:function'.")
    return import_target(target).reached_as(target)


def resolve_kernel(target: str | Kernel | Callable, *, device: str = "cuda", **options) -> Kernel:
    """The :class:`Kernel` that ``target`` names, ready to run on ``device``.

    ``target``: a name from :data:`BUILTIN_KERNELS`, an import path ``package.module:function``, or a
    :class:`Kernel` / callable. ``options`` go to built-ins that take them (``torch:flex``:
    ``compile``; ``flashcheck:triton``: ``block_m``, ``block_n``, ``num_warps``, ``num_stages``,
    ``input_precision``, ``alibi``: ``flashcheck:triton[alibi=linear]`` makes ALiBi ``slope (j - i)``).
    """
    device = _device_type(device)
    use_triton_cache()  # before any kernel compiles, and before a campaign starts its workers
    if isinstance(target, str):
        made = _builtin(target, device, options)
        if made is not None:
            return made
        kernel = _import_path(target)
    elif isinstance(target, Kernel) or callable(target):
        kernel = as_kernel(target)
    else:
        raise InvalidArgument("kernel", target, "expected a kernel name, an import path or a callable",
                              f"Pass one of {_builtin_list()}, 'package.module:function', or the function itself.")
    if options:
        option, value = next(iter(options.items()))
        raise InvalidArgument(option, value, f"options apply to built-in kernels only, not to {kernel.name!r}",
                              "Bind the option in your own function (functools.partial) instead.")
    if device not in kernel.spec.devices:
        raise BackendUnavailable(kernel.name, device, f"its spec declares devices {kernel.spec.devices}",
                                 f"Run it on {kernel.spec.devices[0]!r}, or declare devices=... in @flashcheck.kernel.")
    return kernel
