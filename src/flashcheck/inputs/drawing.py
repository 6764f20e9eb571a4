"""Where a case's numbers are drawn: seeded generators on the device that draws.

A recipe's tensors come from torch generators seeded from the recipe (:func:`seeded`). A campaign on a GPU
draws its cases there (:func:`draw_device`) and keeps them there: no tensor of a passing case ever crosses to
the host, and a case of 2^31 elements costs milliseconds of the GPU's ``randn`` instead of seconds of the
host's plus two copies. CPU and CUDA generators give different numbers, so the same recipe gives other numbers
on a GPU than on the CPU: a case records where it was drawn (its provenance's ``drawn_on``), and a saved case is
known by its tensors, not by its seed alone. ``FLASHCHECK_DRAW=host`` draws a GPU campaign's cases on the host
instead, as every other caller does (self-tests, fixed case lists, :meth:`Recipe.build` by default): then a
seed names the same cases on every machine. The same recipe gives the same case on every draw on one kind of
device (tests/gpu/test_drawing_gpu.py).
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from typing import TYPE_CHECKING

from ..errors import InvalidArgument

if TYPE_CHECKING:  # torch on first use: the command line checks FLASHCHECK_DRAW before it imports torch
    import torch  # here: the command line reads draw_place before it imports torch

__all__ = ["DRAW_VARIABLE", "draw_device", "draw_place", "drawing_on", "drawn_on", "seeded"]

# Where a GPU campaign draws its cases: "device" (its GPU, the default) or "host". An environment variable, so
# that every worker process a campaign starts draws alike.
DRAW_VARIABLE = "FLASHCHECK_DRAW"
DRAW_PLACES = ("device", "host")


def draw_place() -> str:
    """``FLASHCHECK_DRAW``'s place (unset: ``"device"``); an :class:`InvalidArgument` for another value."""
    place = os.environ.get(DRAW_VARIABLE) or "device"
    if place not in DRAW_PLACES:
        raise InvalidArgument(DRAW_VARIABLE, place, "unknown place to draw a GPU campaign's cases",
                              f"Set {DRAW_VARIABLE}=device (the default: on the campaign's GPU) or {DRAW_VARIABLE}=host "
                              "(on the CPU, the same numbers as every other caller), or unset it.")
    return place


def seeded(seed: int) -> torch.Generator:
    """A generator seeded with ``seed`` on the device that draws now (the CPU outside :func:`drawing_on`)."""
    import torch  # here: the command line reads draw_place before it imports torch

    return torch.Generator(device=torch.get_default_device()).manual_seed(int(seed))


def drawing_on(device):
    """A context in which cases are drawn on ``device`` (None or a CPU: the CPU, as outside it)."""
    import torch  # here: the command line reads draw_place before it imports torch

    if device is None or torch.device(device).type == "cpu":
        return nullcontext()
    return torch.device(device)  # a device is a context: torch's factories make their tensors on it


def draw_device(device) -> str:
    """Where a campaign on ``device`` draws its cases: on its GPU, unless ``FLASHCHECK_DRAW=host``
    (:func:`draw_place`); on the CPU for a campaign on the CPU."""
    import torch  # here: the command line reads draw_place before it imports torch

    device = torch.device(device)
    return str(device) if device.type == "cuda" and draw_place() == "device" else "cpu"


def drawn_on(t: torch.Tensor) -> dict:
    """The provenance entry of a case whose tensors were drawn where ``t`` is: ``{"drawn_on": "cuda"}`` for a
    GPU's generator, nothing for the CPU's (every case saved before GPU drawing was drawn there)."""
    return {} if t.device.type == "cpu" else {"drawn_on": t.device.type}
