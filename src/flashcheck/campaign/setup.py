"""Before a campaign's first case: the kernel resolved and the options checked (a usage error, never a
finding), and on a GPU the oracle's CUDA state warmed in the background."""

from __future__ import annotations

import threading

import torch

from ..contract.spec import BACKWARD_FIX, Kernel, as_kernel
from ..errors import InvalidArgument
from ..inputs.presets import Preset
from ..kernels.registry import dtype_left_out, resolve_kernel
from ..numerics.oracle import reference_attention

__all__ = ["prepare_campaign", "warm_oracle"]


def prepare_campaign(kernel: str | Kernel, *, device: str, preset: Preset, dtypes=None, isolate: bool = True,
                     case_timeout: float | None = None, kernel_options: dict | None = None,
                     backward: bool = False) -> tuple:
    """Resolve the kernel and check the options: ``(kernel, isolate, dtypes)``, or :class:`InvalidArgument`."""
    if isinstance(kernel, str):
        resolved = resolve_kernel(kernel, device=device, **(kernel_options or {}))
    else:
        if kernel_options:
            raise InvalidArgument("kernel_options", kernel_options, "options are for a kernel given by name",
                                  "Pass the kernel's name, or bind the options in the kernel itself.")
        resolved, isolate = as_kernel(kernel), False  # an object cannot be resolved again in another process
    if case_timeout is not None and not isolate:
        raise InvalidArgument("case_timeout", case_timeout, "only a worker process can be stopped when a case "
                              "hangs, and this kernel runs in-process",
                              "Pass the kernel by name with isolate=True (CLI: drop --no-isolation), or drop "
                              "the timeout.")
    problem = resolved.spec.backward_problem() if backward else None
    if problem:
        raise InvalidArgument("backward", backward, f"kernel {resolved.name} {problem}",
                              f"{BACKWARD_FIX}, or drop --backward (the forward pass is checked).")
    wanted = list(preset.dtypes if dtypes is None else dtypes)
    dtypes = [d for d in wanted if d in resolved.spec.dtypes]
    if not dtypes:
        raise _no_dtype(resolved, device, wanted)
    return resolved, isolate, dtypes


def _no_dtype(resolved: Kernel, device: str, wanted: list) -> InvalidArgument:
    problem, fix = f"kernel {resolved.name} supports only {resolved.spec.dtypes}", "Pick a dtype the kernel supports."
    why = [(d, reason) for d in wanted if (reason := dtype_left_out(resolved, device, d))]
    if why:  # a built-in that has the dtype, but not on this device
        problem += f" on {device}: {why[0][1]}"
        fix = f"Check {why[0][0]} with --device cuda, or pick one of {resolved.spec.dtypes}."
    return InvalidArgument("dtype", wanted, problem, fix)


def warm_oracle(device) -> None:
    """On a GPU, run the oracle once on a tiny input in a background thread: the CUDA context, the
    cuBLAS handle and the float64 kernels load while the campaign is prepared and the first case drawn
    and run (torch releases the GIL inside its operations), not inside the first case's oracle."""
    if torch.device(device).type != "cuda":
        return

    def warm():
        try:
            q = torch.ones((1, 1, 4, 8), dtype=torch.float16, device=device)
            reference_attention(q, q, q, scale=1.0)
        except Exception:  # noqa: BLE001 - a broken device shows itself in the first case, with its error
            pass

    threading.Thread(target=warm, name="flashcheck-warm-oracle", daemon=True).start()


