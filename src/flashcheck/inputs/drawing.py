"""Where a case's numbers are drawn: seeded generators on the device that draws.

A recipe's tensors come from torch generators seeded from the recipe (:func:`seeded`). On a CPU, drawing
a case of a million elements takes milliseconds of ``randn``; with ``FLASHCHECK_DRAW=device`` a campaign on
a GPU draws its cases there instead (:func:`drawing_on`: torch's factories and the generators then make
every tensor on that device) and keeps the case on the CPU as always. Opt-in, since CPU and CUDA generators
give different numbers: by default a seed names the same cases on every machine. The same recipe gives the
same case on every draw on one kind of device, and a case drawn on a GPU is known by its saved tensors (a
finding's case file), not by its seed alone (tests/gpu/test_drawing_gpu.py).
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch

__all__ = ["draw_device", "drawing_on", "seeded"]


def seeded(seed: int) -> torch.Generator:
    """A generator seeded with ``seed`` on the device that draws now (the CPU outside :func:`drawing_on`)."""
    return torch.Generator(device=torch.get_default_device()).manual_seed(int(seed))


def drawing_on(device):
    """A context in which cases are drawn on ``device`` (None or a CPU: the CPU, as outside it)."""
    if device is None or torch.device(device).type == "cpu":
        return nullcontext()
    return torch.device(device)  # a device is a context: torch's factories make their tensors on it


def draw_device(device) -> str:
    """Where a campaign on ``device`` draws its cases: on its GPU with ``FLASHCHECK_DRAW=device``, else on
    the CPU."""
    device = torch.device(device)
    return str(device) if device.type == "cuda" and os.environ.get("FLASHCHECK_DRAW") == "device" else "cpu"
