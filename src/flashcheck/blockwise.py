"""Float64 array plumbing shared by the oracle and the error model.

Both walk one attention call head by head and in blocks of query rows (so an N x N work array never
exceeds a few megabytes), in numpy on the CPU and in torch float64 on a GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch

from . import masks
from .validation import Shapes

__all__ = ["ops_for", "Block", "iter_blocks", "scatter"]

# Elements of one (rows x keys) float64 work array: ~16 MB on the CPU (cache-sized); on a GPU a whole
# head of 4096 x 4096 at once (128 MB), so launches and host syncs stay few.
MAX_BLOCK_ELEMENTS = {"cpu": 1 << 21, "cuda": 1 << 24}


def visible_block(causal: str, attn_mask, shapes: Shapes, b: int, h: int, rows: torch.Tensor,
                   device, *, allow_none: bool = False) -> torch.Tensor | None:
    """Visibility (R, Nk) of the given query rows of head (b, h).

    With ``allow_none``, None stands for "every key visible" (no causal mode, no mask), which spares
    the caller a pass over the scores.
    """
    if allow_none and causal == "none" and attn_mask is None:
        return None
    fn = masks.causal(causal, shapes.n_q, shapes.n_k)
    q_idx = rows.to(device).view(-1, 1)
    kv_idx = torch.arange(shapes.n_k, device=device).view(1, -1)
    vis = torch.broadcast_to(fn(b, h, q_idx, kv_idx), (q_idx.shape[0], shapes.n_k))
    if attn_mask is not None:
        full = torch.broadcast_to(attn_mask, (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k))
        vis = vis & full[b, h].index_select(0, rows.to(attn_mask.device)).to(device)
    return vis


def _concat(cat, xs, axis):
    """Columns side by side; a 1-d operand becomes one column."""
    return cat([x.reshape(x.shape[0], -1) for x in xs], axis)


class _NumpyOps:
    """The few array operations the float64 oracle needs, on numpy (CPU)."""

    @staticmethod
    def asarray(t: torch.Tensor):
        return t.detach().cpu().to(torch.float64).numpy()

    @staticmethod
    def mask(t: torch.Tensor):
        return t.cpu().numpy()

    @staticmethod
    def float64(x):
        return x.astype(np.float64)

    concat = staticmethod(lambda xs, axis: _concat(np.concatenate, xs, axis))
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)

    @staticmethod
    def amax(x, axis):
        return np.max(x, axis=axis, keepdims=True)

    @staticmethod
    def sum(x, axis):
        return np.sum(x, axis=axis, keepdims=True)

    @staticmethod
    def logsumexp(x, axis):
        top = np.max(x, axis=axis, keepdims=True)
        top = np.where(np.isfinite(top), top, 0.0)
        with np.errstate(divide="ignore"):
            return top + np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True))

    @staticmethod
    def store(dst: torch.Tensor, index, src) -> None:
        view = dst.numpy()[index]  # a CPU tensor shares its memory with this array
        view[...] = src.reshape(view.shape)


class _TorchOps:
    """The same operations in torch float64 (GPU)."""

    @staticmethod
    def asarray(t: torch.Tensor):
        return t.detach().to(torch.float64)

    @staticmethod
    def mask(t: torch.Tensor):
        return t

    @staticmethod
    def float64(x):
        return x.to(torch.float64)

    concat = staticmethod(lambda xs, axis: _concat(torch.cat, xs, axis))

    @staticmethod
    def minimum(a, b):
        return torch.minimum(a, b) if torch.is_tensor(b) else torch.clamp(a, max=b)

    @staticmethod
    def maximum(a, b):
        return torch.maximum(a, b) if torch.is_tensor(b) else torch.clamp(a, min=b)

    @staticmethod
    def amax(x, axis):
        return torch.amax(x, dim=axis, keepdim=True)

    @staticmethod
    def sum(x, axis):
        return torch.sum(x, dim=axis, keepdim=True)

    @staticmethod
    def logsumexp(x, axis):
        return torch.logsumexp(x, dim=axis, keepdim=True)

    @staticmethod
    def store(dst: torch.Tensor, index, src) -> None:
        view = dst[index]
        view.copy_(src.reshape(view.shape))


# Functions with the same name and meaning in numpy and torch are bound once for both.
for _ops, _xp in ((_NumpyOps, np), (_TorchOps, torch)):
    for _name in ("matmul", "exp", "expm1", "log", "sqrt", "abs", "where"):
        setattr(_ops, _name, staticmethod(getattr(_xp, _name)))


def ops_for(device) -> type:
    """numpy on the CPU, torch float64 on a GPU (``FLASHCHECK_TORCH_OPS=1`` forces torch everywhere,
    which lets CPU-only CI exercise the GPU code path)."""
    if torch.device(device).type == "cuda" or os.environ.get("FLASHCHECK_TORCH_OPS") == "1":
        return _TorchOps
    return _NumpyOps


@dataclass
class Block:
    """Query rows ``rows`` (positions ``sl`` of the output) of head ``h`` in batch entry ``b``."""

    b: int
    h: int
    kv_head: int
    sl: slice
    Q: object  # (R, D) float64
    K: object  # (Nk, D) float64, shared by the query heads of one kv head
    V: object  # (Nk, Dv) float64
    vis: object  # (R, Nk) bool, or None when every key is visible
    new_kv: bool  # first block of this (b, kv_head): per-kv precomputation may be refreshed


def iter_blocks(ops, q, k, v, causal, attn_mask, shapes: Shapes, rows_all: torch.Tensor, *,
                allow_none: bool = False):
    """Every (b, h, block of rows) of an attention call, with float64 operands.

    ``allow_none``: a block whose keys are all visible gets ``vis=None`` (see :func:`visible_block`).
    """
    device = q.device
    R = rows_all.numel()
    cap = MAX_BLOCK_ELEMENTS["cuda" if device.type == "cuda" else "cpu"]
    step = max(1, min(R, cap // shapes.n_k))
    for b in range(shapes.batch):
        for kvh in range(shapes.heads_kv):
            K = ops.asarray(k[b, kvh])
            V = ops.asarray(v[b, kvh])
            new_kv = True
            for h in range(kvh * shapes.group, (kvh + 1) * shapes.group):
                Qh = ops.asarray(q[b, h])
                for r0 in range(0, R, step):
                    rows = rows_all[r0:r0 + step]
                    vis = visible_block(causal, attn_mask, shapes, b, h, rows, device, allow_none=allow_none)
                    vis = None if vis is None else ops.mask(vis)
                    yield Block(b, h, kvh, slice(r0, r0 + rows.numel()), Qh[ops.mask(rows.to(device))],
                                K, V, vis, new_kv)
                    new_kv = False


def scatter(ops, outputs, block: Block, results, device) -> None:
    """Write one block's per-row results into the (B, H, R, ...) output tensors."""
    for dst, src in zip(outputs, results):
        ops.store(dst, (block.b, block.h, block.sl), src)
