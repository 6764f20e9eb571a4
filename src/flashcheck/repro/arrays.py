"""Tensors as data a reproducer can hold: the raw bits of a tensor's whole storage with its dtype, shape, strides and
storage offset, so that the script's ``tensor`` (:mod:`flashcheck.repro._script`) rebuilds the same view of the
same memory: a transposed, strided, stride-0 or offset view stays one, the NaN that flashcheck put around it
included. bf16, fp8 and bool are carried as the integers of their bits.

The bits go in a tensors file beside the script (:class:`TensorFile`: an npz of one array per tensor, which the
script checks by its SHA-256 and reads without numpy), so that the script stays a short text whatever the size of
the case."""

from __future__ import annotations

import io

import numpy as np
import torch

from ..contract.formats import FORMATS, bits_dtype

__all__ = ["TensorFile"]

# Each dtype's bits, as an integer dtype of the same size that numpy and torch.frombuffer both read.
_BITS = {torch.float64: torch.int64, **{f.dtype: bits_dtype(f.dtype) for f in FORMATS.values()},
         torch.bool: torch.uint8, torch.int64: torch.int64, torch.int32: torch.int32, torch.uint8: torch.uint8,
         torch.int16: torch.int16}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _storage(t: torch.Tensor) -> tuple[dict, np.ndarray]:
    """The view of ``t`` (on any device) on its storage, and that whole storage as the integers of its bits."""
    t = t.detach()
    bits = _BITS.get(t.dtype) or bits_dtype(t.dtype)  # a scale format's (e8m0) by its width
    storage = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage()).cpu()
    view = {"dtype": _name(t.dtype), "bits_dtype": _name(bits), "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset()}
    return view, storage.view(bits).numpy()


class TensorFile:
    """The tensors of a reproducer kept in a file beside it (``repro.npz``): the script's data names each one's
    array and its view."""

    NAME = "repro.npz"

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def encode(self, t: torch.Tensor | None, name: str) -> dict | None:
        """``t`` as the script's data, its storage's bits under ``name`` in the file."""
        if t is None:
            return None
        view, self.arrays[name] = _storage(t)
        return {**view, "array": name}

    def content(self) -> bytes:
        """The file: the arrays encoded so far, compressed."""
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **self.arrays)
        return buffer.getvalue()
