"""Before a campaign's first case: the kernel resolved and the options checked (a usage error, never a
finding), and on a GPU the oracle's CUDA state warmed in the background."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ..contract.spec import BACKWARD_FIX, Kernel, as_kernel
from ..errors import InvalidArgument
from ..kernels.registry import dtype_left_out, resolve_kernel
from ..numerics.oracle import reference_attention
from .config import CampaignConfig

__all__ = ["Prepared", "prepare_campaign", "warm_oracle"]


@dataclass(frozen=True)
class Prepared:
    """A campaign's kernel, resolved, and the dtypes it is checked in (those asked for that it supports)."""

    kernel: Kernel
    dtypes: list


def prepare_campaign(config: CampaignConfig) -> Prepared:
    """Resolve the kernel and check the config against it, or :class:`InvalidArgument` (what the config can
    check alone it checked when it was made)."""
    target = config.target
    if target.by_name:
        resolved = resolve_kernel(target.kernel, device=target.device, **(target.kernel_options or {}))
    else:
        resolved = as_kernel(target.kernel)
    problem = resolved.spec.backward_problem() if target.backward else None
    if problem:
        raise InvalidArgument("backward", target.backward, f"kernel {resolved.name} {problem}",
                              f"{BACKWARD_FIX}, or drop --backward (the forward pass is checked).")
    wanted = list(target.preset.dtypes if target.dtypes is None else target.dtypes)
    dtypes = [d for d in wanted if d in resolved.spec.dtypes]
    if not dtypes:
        raise _no_dtype(resolved, target.device, wanted)
    return Prepared(resolved, dtypes)


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


