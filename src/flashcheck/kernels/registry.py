"""The kernel registry: from a name, an import path or a callable to a :class:`~flashcheck.contract.spec.Kernel`.

``resolve_kernel(target, device=..., **options)`` accepts

- a built-in name (:data:`BUILTIN_KERNELS`): ``torch:math``, ``torch:flash``, ``torch:efficient``,
  ``torch:cudnn`` (PyTorch SDPA with that one backend forced), ``torch:flex`` (FlexAttention) and
  ``flashcheck:triton`` (the project's Triton kernel; tile sizes as options);
- an import path ``package.module:function`` (``function`` may be dotted: ``module:Class.method``)
  naming a :class:`Kernel` or a plain callable, which gets the conservative default spec;
- a :class:`Kernel` or a callable passed directly.

Every refusal names the backend, the device and the reason: :class:`BackendUnavailable` when a
kernel cannot run here, :class:`InvalidArgument` for a bad name, path or option.

Nothing here imports triton. For ``flashcheck:triton`` on the CPU the registry sets
``TRITON_INTERPRET=1`` (Triton reads it when a kernel is jitted, which flashcheck does lazily).
Resolving any kernel applies ``$FLASHCHECK_TRITON_CACHE`` (see :mod:`flashcheck.kernels.triton.cache`).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from typing import Callable

import torch

from ..contract.formats import DEVICES
from ..contract.spec import Kernel, as_kernel
from ..errors import BackendUnavailable, InvalidArgument
from .fp8 import FP8, FP8_MUTANTS, FP8_TRITON_MUTANTS
from .names import dotted, import_target, parse_kernel_name
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON, SDPA_KERNELS
from .serving import SERVING_KERNELS, SERVING_MUTANTS
from .triton.cache import use_triton_cache
from .triton.forms import TRITON_FORMS, make_triton_form
from .triton.runtime import BACKEND_NAME as TRITON

__all__ = ["BUILTIN_KERNELS", "DEVICES", "available_kernels", "kernel_options", "parse_kernel_name", "planted_bugs",
           "resolve_kernel"]

FLEX = "torch:flex"
FLEX_VARLEN = "torch:flex-varlen"
FLA = "fla:parallel_attn"
FLA_VARLEN = "fla:parallel_attn-varlen"
FLA_DECODING = "fla:attn_decoding"
TRITON_FP8 = "flashcheck:triton-fp8"

BUILTIN_KERNELS: dict[str, str] = {
    **{name: description for name, (_, description) in SDPA_KERNELS.items()},
    FLEX: "PyTorch FlexAttention, the torch.compile'd fused kernel (options compile=False: unfused eager path; "
          "alibi=linear: ALiBi as slope (j - i))",
    TRITON: "flashcheck's own Triton flash-attention kernel (tile sizes and compiler settings as options; "
            "alibi=linear: ALiBi as slope (j - i); on the CPU it runs under the Triton interpreter)",
    FLA: "flash-linear-attention's Triton softmax attention (fla-core's parallel_attn: causal, window, sinks; "
         "pip install fla-core einops)",
    FLA_VARLEN: "fla-core's parallel_attn on a packed varlen batch (its cu_seqlens: each sequence's queries are its "
                "keys)",
    FLA_DECODING: "fla-core's attn_decoding_one_step on a packed varlen batch: each query as a decoding step at the "
                  "end of its key prefix (bottom-right causal)",
    **SERVING_KERNELS,
    FLEX_VARLEN: "FlexAttention on a packed varlen batch with a document mask (causal per document; option "
                 "compile=False: unfused eager path)",
    **{name: form.description for name, form in TRITON_FORMS.items()},
    FP8: "fp8 attention (e4m3, e5m2) with FA3's q/k/v descales in torch: fp32 scores, P rounded to fp8, bf16 out",
    TRITON_FP8: "flashcheck's own Triton kernel on fp8 inputs with FA3's descales (fp8 tensor-core dots; GPU only: "
                "the Triton interpreter's fp8 conversion rounds wrongly)",
}

# Built-in names live under these prefixes; anything else with a colon is an import path.
_RESERVED_PREFIXES = ("torch", "flashcheck", "fla")


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
# Options
# ------------------------------------------------------------------------------------------------


def _keywords(factory) -> tuple:
    """The options a kernel's factory takes: its keywords, but the device and the planted bug."""
    params = inspect.signature(factory).parameters.values()
    return tuple(p.name for p in params
                 if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in ("device", "mutant"))


def kernel_options(name: str) -> tuple | None:
    """The options the built-in ``name`` takes (``name[option=value]``), read from the function that makes it;
    None when that function cannot be imported (resolving the kernel then says why)."""
    try:
        if name == FLEX:
            from .flex import make_flex_kernel as factory
        elif name == FLEX_VARLEN:
            from .flex_varlen import make_flex_varlen_kernel as factory
        elif name == TRITON:
            from .triton.forward import make_kernel as factory
        elif name in ("torch:varlen", "torch:paged"):  # torch:jagged and torch:split-kv run no SDPA backend
            from .serving import make_serving_kernel as factory
        else:
            return ()
    except ImportError:
        return None
    return _keywords(factory)


def planted_bugs(name: str) -> tuple[str, ...]:
    """The planted bugs of the built-in ``name`` (``name~BUG``): the table its maker checks a name against."""
    if name == TRITON:
        from .triton.mutants import known_mutants

        return known_mutants()
    if name in TRITON_FORMS:
        return tuple(TRITON_FORMS[name].mutants)
    if name in SERVING_KERNELS:
        return tuple(m for m, (form, _) in SERVING_MUTANTS.items() if name == f"torch:{form}")
    if name == FP8:
        return tuple(FP8_MUTANTS)
    if name == TRITON_FP8:
        return tuple(FP8_TRITON_MUTANTS)
    return ()


def _check_options(name: str, options: dict) -> None:
    valid = kernel_options(name)
    if valid is None:
        return
    for option, value in options.items():
        if option not in valid:
            fix = f"Options of {name}: {', '.join(valid)}." if valid else f"{name} takes no options."
            raise InvalidArgument(option, value, f"not an option of kernel {name!r}", fix)


# ------------------------------------------------------------------------------------------------
# flashcheck:triton
# ------------------------------------------------------------------------------------------------


def _triton_unavailable(device: str) -> BackendUnavailable | None:
    """Why flashcheck:triton cannot run on ``device``, without changing anything; None if it can."""
    if importlib.util.find_spec("triton") is None:
        fix = "pip install 'flashcheck[cpu]' for the CPU interpreter." if device == "cpu" else "pip install triton."
        return BackendUnavailable(TRITON, device, "triton is not installed", fix)
    if device == "cuda":
        if not torch.cuda.is_available():
            return BackendUnavailable(TRITON, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
        if os.environ.get("TRITON_INTERPRET") == "1":
            return BackendUnavailable(TRITON, "cuda", "TRITON_INTERPRET=1 is set, so Triton would run the kernel in "
                                      "its CPU interpreter instead of compiling it for the GPU",
                                      "Unset TRITON_INTERPRET before starting Python, or use --device cpu.")
        return None
    # Triton decides between compiling and interpreting when a kernel is jitted; flashcheck jits its
    # kernel on the first call, so only a kernel already jitted for the GPU makes the switch too late.
    # (Triton itself may already be imported: torch._dynamo imports it, e.g. via torch.nn.attention.bias.)
    module = sys.modules.get(__package__ + ".triton.forward")
    jitted = getattr(module, "_JITTED", None) or {}
    if os.environ.get("TRITON_INTERPRET") != "1" and jitted and not jitted.get("interpreted", False):
        return BackendUnavailable(
            TRITON, "cpu", "triton was already imported and flashcheck's kernel jitted without TRITON_INTERPRET=1, "
            "so Triton cannot switch to its CPU interpreter in this process",
            "Set TRITON_INTERPRET=1 before importing triton (or run flashcheck's CLI with --device cpu, which does it).",
        )
    return None


def _make_triton(device: str, options: dict, mutant: str | None = None) -> Kernel:
    problem = _triton_unavailable(device)
    if problem is not None:
        raise problem
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        from .triton.forward import make_kernel, on_device
    except ImportError as exc:
        raise BackendUnavailable(TRITON, device, f"flashcheck.kernels.triton.forward cannot be imported ({exc})",
                                 "Reinstall flashcheck.") from exc
    if mutant is not None:  # a planted-bug variant of the self-test, by name
        from .triton.mutants import load_mutant

        made = load_mutant(mutant, **options)
    else:
        made = make_kernel(**options)
    return on_device(made, device)


def _make_triton_form(name: str, device: str, mutant: str | None = None) -> Kernel:
    """flashcheck's Triton kernel of a serving form (:data:`TRITON_FORMS`), or a planted-bug variant of it."""
    problem = _triton_unavailable(device)
    if problem is not None:
        raise BackendUnavailable(name, device, problem.reason, problem.fix)
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return make_triton_form(name, device=device, mutant=mutant)


def _make_triton_fp8(device: str, mutant: str | None = None) -> Kernel:
    if device == "cpu":  # measured: its fp32 -> fp8 casts lose the carry into the exponent (tests/interpreter)
        raise BackendUnavailable(TRITON_FP8, "cpu", "the Triton interpreter rounds fp32 to fp8 wrongly (values that "
                                 "round up to a power of two come out at the power of two below)",
                                 "Run it on a GPU with fp8 tensor cores (compute capability 8.9 or newer).")
    problem = _triton_unavailable(device)
    if problem is not None:
        raise BackendUnavailable(TRITON_FP8, device, problem.reason, problem.fix)
    from .triton.fp8 import make_fp8_triton_kernel

    return make_fp8_triton_kernel(device=device, mutant=mutant)


def dtype_left_out(kernel: Kernel, device: str, dtype: str) -> str | None:
    """Why a built-in kernel's spec leaves ``dtype`` out on ``device`` although the kernel has it
    (flashcheck:triton under the Triton interpreter); None when it does not."""
    if _device_type(device) != "cpu" or parse_kernel_name(kernel.source or "")[0] != TRITON:
        return None
    from .triton.forward import INTERPRETER_WRONG_DTYPES

    return INTERPRETER_WRONG_DTYPES.get(dtype)


# ------------------------------------------------------------------------------------------------
# Built-ins
# ------------------------------------------------------------------------------------------------


def _make_builtin(name: str, device: str, options: dict) -> Kernel:
    _check_options(name, options)
    if name in SDPA_KERNELS:
        from .sdpa import make_sdpa_kernel

        return make_sdpa_kernel(name, device=device)
    if name == FLEX:
        from .flex import make_flex_kernel

        return make_flex_kernel(device=device, **options)
    if name == FLA_DECODING:
        from .fla import make_fla_decoding_kernel

        return make_fla_decoding_kernel(device=device)
    if name in (FLA, FLA_VARLEN):
        from .fla import make_fla_kernel

        return make_fla_kernel(device=device, form="varlen" if name == FLA_VARLEN else "dense")
    if name in SERVING_KERNELS:
        from .serving import make_serving_kernel

        return make_serving_kernel(name, device=device, **options)
    if name == FLEX_VARLEN:
        from .flex_varlen import make_flex_varlen_kernel

        return make_flex_varlen_kernel(device=device, **options)
    if name in TRITON_FORMS:
        return _make_triton_form(name, device)
    if name == FP8:
        from .fp8 import make_fp8_kernel

        return make_fp8_kernel(device=device)
    if name == TRITON_FP8:
        return _make_triton_fp8(device)
    return _make_triton(device, options)


def _why_unavailable(name: str, device: str) -> BackendUnavailable | None:
    """Side-effect-free availability check of a built-in (never sets TRITON_INTERPRET)."""
    if name == TRITON or name in TRITON_FORMS:
        problem = _triton_unavailable(device)
        return problem and BackendUnavailable(name, device, problem.reason, problem.fix)
    if name in (FLA, FLA_VARLEN, FLA_DECODING):  # importing fla jits its kernels: only look for it
        from .fla import unavailable

        return unavailable(device, name)
    try:
        _make_builtin(name, device, {})
    except BackendUnavailable as exc:
        return exc
    return None


def available_kernels(device: str = "cuda") -> tuple:
    """The built-in kernel names that can run on ``device`` (``"cuda"`` or ``"cpu"``) here."""
    device = _device_type(device)
    return tuple(name for name in BUILTIN_KERNELS if _why_unavailable(name, device) is None)


# ------------------------------------------------------------------------------------------------
# Import paths
# ------------------------------------------------------------------------------------------------


# ------------------------------------------------------------------------------------------------
# resolve_kernel
# ------------------------------------------------------------------------------------------------


def _planted(target: str, base: str, mutant: str, device: str, options: dict) -> Kernel:
    """The built-in ``base`` with its planted bug ``mutant`` (each maker refuses a name it does not plant)."""
    if not planted_bugs(base):
        planted = [name for name in BUILTIN_KERNELS if planted_bugs(name)]
        raise InvalidArgument("kernel", target, f"planted-bug variants exist for {', '.join(planted)} only",
                              "`flashcheck kernels` lists each kernel's planted bugs (KERNEL~NAME).")
    _check_options(base, options)
    if base in TRITON_FORMS:
        return _make_triton_form(base, device, mutant)
    if base == FP8:
        from .fp8 import make_fp8_kernel

        return make_fp8_kernel(device=device, mutant=mutant)
    if base == TRITON_FP8:
        return _make_triton_fp8(device, mutant)
    if base in SERVING_KERNELS:
        from .serving import make_serving_kernel

        return make_serving_kernel(base, device=device, mutant=mutant, **options)
    problem = _triton_unavailable(device)
    if problem is not None:
        raise problem
    return _make_triton(device, options, mutant=mutant)


def _builtin_reached(kernel: Kernel) -> Kernel:
    # A built-in's name holds its options (flashcheck:triton[block_m=32,block_n=64]): it resolves back.
    return kernel.reached_as(kernel.name)


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
        base, mutant, named = parse_kernel_name(target)
        if base in BUILTIN_KERNELS and (named or mutant):
            merged = {**named, **options}
            if mutant is not None:
                return _builtin_reached(_planted(target, base, mutant, device, merged))
            return _builtin_reached(_make_builtin(base, device, merged))
        if target in BUILTIN_KERNELS:
            return _builtin_reached(_make_builtin(target, device, options))
        module_name, colon, attr_path = target.partition(":")
        if module_name in _RESERVED_PREFIXES and colon:
            raise InvalidArgument("kernel", target, "unknown built-in kernel",
                                  f"Built-in kernels: {_builtin_list()}.")
        if not (colon and dotted(module_name) and dotted(attr_path)):
            raise InvalidArgument("kernel", target, "neither a built-in kernel name nor an import path",
                                  f"Use a built-in ({_builtin_list()}) or 'package.module:function'.")
        kernel = import_target(target).reached_as(target)
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
