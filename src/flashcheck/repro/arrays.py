"""Tensors as data a reproducer can hold: the raw bits of a tensor's whole storage (lzma, then base64) with its
dtype, shape, strides and storage offset, so that the script's ``tensor`` (:mod:`flashcheck.repro._script`)
rebuilds the same view of the same memory: a transposed, strided, stride-0 or offset view stays one, the NaN
that flashcheck put around it included. bf16, fp8 and bool are carried as the integers of their bits."""

from __future__ import annotations

import base64
import lzma

import torch

__all__ = ["encode_tensor", "LINE"]

LINE = 100  # characters of base64 per line of the script
# Each dtype's bits, as an integer dtype of the same size that numpy and torch.frombuffer both read.
_BITS = {torch.float64: torch.int64, torch.float32: torch.int32, torch.float16: torch.int16,
         torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8,
         torch.bool: torch.uint8, torch.int64: torch.int64, torch.int32: torch.int32, torch.uint8: torch.uint8,
         torch.int16: torch.int16}


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode_tensor(t: torch.Tensor | None) -> dict | None:
    """``t`` (on any device) as the script's data: its storage's bits and the view on them."""
    if t is None:
        return None
    t = t.detach()
    bits = _BITS[t.dtype]
    # The whole storage, as a flat tensor of t's dtype, then as the integers of its bits.
    storage = torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage()).cpu()
    raw = storage.view(bits).numpy().tobytes()
    text = base64.b64encode(lzma.compress(raw, preset=9)).decode("ascii")
    return {"dtype": _name(t.dtype), "bits_dtype": _name(bits), "shape": list(t.shape), "stride": list(t.stride()),
            "offset": t.storage_offset(), "bits": [text[i:i + LINE] for i in range(0, len(text), LINE)]}
