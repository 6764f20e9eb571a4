"""Float64 array plumbing shared by the oracle and the error model.

Both see one attention call as a few large batched array operations: every batch entry and head at
once, with the query heads of one K/V head side by side (arrays of shape (P, G, rows, keys), P = B * Hkv
flattened, G = Hq / Hkv), so that GQA needs no copy of K or V. Only when the (rows x keys) work arrays
of the whole call would not fit does the walk split it, first along the rows, then along the heads:
the block size is chosen from the memory the device has free, not fixed. numpy on the CPU, torch
float64 on a GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import numpy as np
import torch

from ..contract import masks
from ..contract.validation import Shapes
from ..features.variant import Variant
from .quantized_inside import inside_values

__all__ = ["ops_for", "AttentionCall", "Block", "iter_blocks", "scatter", "add_into", "visible_block", "block_elements",
           "dequantized", "by_group"]

# How many (rows x keys) float64 work arrays the budget keeps alive at once, with room to spare.
LIVE_ARRAYS = 16
# CPU: ~32 MB a work array keeps numpy's passes in step with the caches and the walk short.
CPU_BLOCK_ELEMENTS = 1 << 22
# GPU: at most this many elements a work array (512 MB), and at most this share of the free memory,
# so that several campaign processes can share one GPU.
GPU_BLOCK_ELEMENTS = 1 << 26
GPU_FREE_SHARE = 0.25


def block_elements(device) -> int:
    """Elements one (rows x keys) float64 work array may have on ``device``: from the free memory on a
    GPU (what the caching allocator holds counts as free), a cache-sized constant on the CPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return CPU_BLOCK_ELEMENTS
    free, _ = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    by_memory = int(free * GPU_FREE_SHARE) // (8 * LIVE_ARRAYS)
    return max(1 << 16, min(GPU_BLOCK_ELEMENTS, by_memory))


def visible_block(causal: str, attn_mask, shapes: Shapes, rows: torch.Tensor, device, *,
                  heads: slice | None = None, allow_none: bool = False, variant=None):
    """Visibility of the given query rows as a (P or 1, G or 1, R, Nk) bool tensor, P = B * Hkv flattened
    (``heads`` selects a range of it); ``variant``'s visible keys (:meth:`~flashcheck.Variant.visible`)
    restrict it further.

    With ``allow_none``, None stands for "every key visible" (no causal mode, no mask), which spares
    the caller a pass over the scores.
    """
    extra = None if variant is None else variant.visible(shapes.n_q, shapes.n_k, shapes.heads_q)
    if allow_none and causal == "none" and attn_mask is None and extra is None:
        return None
    fn = masks.causal(causal, shapes.n_q, shapes.n_k)
    fn = fn if extra is None else masks.and_masks(fn, extra)
    q_idx = rows.to(device).view(-1, 1)
    kv_idx = torch.arange(shapes.n_k, device=device).view(1, -1)
    if variant is not None and variant.keys_by_head:
        b, h = _grouped_heads(shapes, heads, device)
        vis = fn(b, h, q_idx.view(1, 1, -1, 1), kv_idx.view(1, 1, 1, -1))
        vis = torch.broadcast_to(vis, (b.shape[0], shapes.group, q_idx.shape[0], shapes.n_k))
    else:
        vis = torch.broadcast_to(fn(0, 0, q_idx, kv_idx), (q_idx.shape[0], shapes.n_k)).view(1, 1, -1, shapes.n_k)
    if attn_mask is not None:
        full = torch.broadcast_to(attn_mask, (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k))
        grouped = full.reshape(shapes.batch * shapes.heads_kv, shapes.group, shapes.n_q, shapes.n_k)
        grouped = grouped[heads if heads is not None else slice(None)]
        vis = vis & grouped.index_select(2, rows.to(attn_mask.device)).to(device)
    shown = None if variant is None else variant.shown(shapes.n_q, shapes.n_k, shapes.heads_q)
    if shown is not None:  # keys shown whatever the rest hides (trusted full blocks): a per-head feature's
        b, h = _grouped_heads(shapes, heads, device)
        vis = vis | shown(b, h, q_idx.view(1, 1, -1, 1), kv_idx.view(1, 1, 1, -1))
    return vis


def _grouped_heads(shapes: Shapes, heads: slice | None, device):
    """(b, h): the batch entry and query head of each (P, G) position of the grouped heads ``heads`` (P = B * Hkv
    flattened), as (P', G, 1, 1) indices."""
    p = torch.arange(shapes.batch * shapes.heads_kv, device=device)[heads if heads is not None else slice(None)]
    g = torch.arange(shapes.group, device=device).view(1, -1)
    b = (p // shapes.heads_kv).view(-1, 1).expand(-1, shapes.group)
    h = (p % shapes.heads_kv).view(-1, 1) * shapes.group + g
    return b[..., None, None], h[..., None, None]


def _fit(src, view):
    # Per-row results keep their reduced key axis (R, 1); the (B, Hq, R) outputs have none.
    return src[..., 0] if src.ndim > view.ndim else src


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

    concat = staticmethod(np.concatenate)
    minimum = staticmethod(np.minimum)
    maximum = staticmethod(np.maximum)

    @staticmethod
    def swap(x):
        return np.swapaxes(x, -1, -2)

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
        view[...] = np.broadcast_to(_fit(src, view), view.shape)


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

    concat = staticmethod(torch.cat)

    @staticmethod
    def minimum(a, b):
        return torch.minimum(a, b) if torch.is_tensor(b) else torch.clamp(a, max=b)

    @staticmethod
    def maximum(a, b):
        return torch.maximum(a, b) if torch.is_tensor(b) else torch.clamp(a, min=b)

    @staticmethod
    def swap(x):
        return x.transpose(-1, -2)

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
        view.copy_(torch.broadcast_to(_fit(src, view), view.shape))


# Functions with the same name and meaning in numpy and torch are bound once for both.
for _ops, _xp in ((_NumpyOps, np), (_TorchOps, torch)):
    for _name in ("matmul", "exp", "expm1", "log", "sqrt", "abs", "where", "tanh", "broadcast_to"):
        setattr(_ops, _name, staticmethod(getattr(_xp, _name)))


def by_group(a, b):
    """``a`` (B, Hq, R, X) @ ``b`` (B or 1, Hkv, X, C) -> (B, Hq, R, C), each query head against its K/V head: a K/V
    head's query heads are the rows of one matmul, where torch.matmul would copy ``b`` per query head to broadcast
    it (measured on an H100: 60 to 136 GiB asked for the 128 query heads of an MLA cache)."""
    if a.dim() != 4 or b.dim() != 4 or b.shape[1] == a.shape[1]:
        return torch.matmul(a, b)
    batch, heads_q, rows, _ = a.shape
    out = torch.matmul(a.reshape(batch, b.shape[1], heads_q // b.shape[1] * rows, -1), b)
    return out.view(out.shape[0], heads_q, rows, -1)


_TorchOps.matmul = staticmethod(by_group)  # a block's K and V are (p, 1, ...) against (p, G, ...)


def ops_for(device) -> type:
    """numpy on the CPU, torch float64 on a GPU (``FLASHCHECK_TORCH_OPS=1`` forces torch everywhere,
    which lets CPU-only CI exercise the GPU code path)."""
    if torch.device(device).type == "cuda" or os.environ.get("FLASHCHECK_TORCH_OPS") == "1":
        return _TorchOps
    return _NumpyOps


@dataclass
class Block:
    """Query rows ``rows`` (positions ``sl`` of the output) of the flattened K/V heads ``heads``.

    Arrays are (p, G, ...) with p = the heads in the block and G = query heads per K/V head; K and V
    have G = 1 and broadcast over the group.
    """

    heads: slice  # a range of P = B * Hkv (flattened batch entry and K/V head)
    sl: slice
    Q: object  # (p, G, R, D) float64
    K: object  # (p, 1, Nk, D) float64
    V: object  # (p, 1, Nk, Dv) float64
    vis: object  # (p or 1, G or 1, R, Nk) bool, or None when every key is visible
    cap: float | None = None  # the variant's finite cap, applied to the scaled logits
    # The variant's sink logits, (p, G, 1, 1) float64: K and V then end with one more key, a zero row,
    # which stands for the sink (its logit is the sink, its value 0), and vis with a visible column for it.
    sink: object = None
    # The variant's additive bias (every bias feature's, summed), (p or 1, G or 1, R or 1, Nk or 1) float64, 0
    # where it hides a key (vis has those keys masked), and the magnitude a kernel's bias arithmetic rounds on.
    bias: object = None
    bias_size: object = None
    bias_first: bool = False  # the bias goes into the cap (else it is added to the capped logits)
    # A kernel that quantizes inside: how far each value of Q (p, G, R, D) and K (p, 1, Nk, D) may sit from the
    # emulated quantizer's (one code, where an approximate division may round it the other way), or None.
    slack: tuple | None = None


def dequantized(q, k, v, variant):
    """The values the numerics work on (:meth:`~flashcheck.features.variant.Variant.dequantized`; without a
    variant, the inputs as they are)."""
    return (q, k, v) if variant is None else variant.dequantized(q, k, v)


def _grouped(shapes: Shapes, q, k, v):
    """Q as (P, G, Nq, D), K and V as (P, 1, Nk, .): the query heads of one K/V head side by side, still in
    the inputs' dtype (views where the inputs are contiguous): each block turns its own heads to float64."""
    P, G = shapes.batch * shapes.heads_kv, shapes.group
    return (q.reshape(P, G, shapes.n_q, shapes.head_dim), k.reshape(P, 1, shapes.n_k, shapes.head_dim),
            v.reshape(P, 1, shapes.n_k, shapes.head_dim_v))


def _steps(shapes: Shapes, rows: int, cap: int) -> tuple[int, int]:
    """(heads, rows) per block so that heads * G * rows * Nk stays within ``cap`` elements, and the block's K and
    V in float64 within ``LIVE_ARRAYS / 2`` of them (one K/V head at least: a long decode row is mostly keys)."""
    per_row = shapes.group * max(shapes.n_k, 1)
    row_step = max(1, min(rows, cap // per_row))
    head_step = max(1, cap // (per_row * row_step)) if row_step == rows else 1
    per_head_kv = max(shapes.n_k, 1) * (shapes.head_dim + shapes.head_dim_v)
    return max(1, min(head_step, cap * LIVE_ARRAYS // 2 // per_head_kv)), row_step


def _sink_key(ops, shapes: Shapes, K, V, variant, device, heads: slice):
    """A block's K and V (its ``heads``) with the sink's zero key appended, and its sink logits as
    (p, G, 1, 1); unchanged without a sink."""
    if variant is None or variant.sink is None:
        return K, V, None
    P, G = shapes.batch * shapes.heads_kv, shapes.group
    sink = variant.sink.to(device).reshape(1, shapes.heads_kv, G).expand(shapes.batch, -1, -1)
    # Inputs are finite (the oracle checks), so 0 * a row is a zero row of the array's own kind.
    return (ops.concat((K, 0 * K[:, :, :1]), -2), ops.concat((V, 0 * V[:, :, :1]), -2),
            ops.asarray(sink.reshape(P, G, 1, 1)[heads]))


def _with_sink_column(vis, sink, rows: int, n_k: int):
    """``vis`` with the sink's column: visible where the sink is finite (a -inf sink is no key at all)."""
    finite = torch.as_tensor(sink > -math.inf)  # (p, G, 1, 1)
    if vis is None and bool(finite.all()):
        return None
    finite = finite.to(vis.device) if vis is not None else finite
    if vis is None:
        vis = torch.ones((1, 1, rows, n_k), dtype=torch.bool, device=finite.device)
    shape = tuple(max(a, b) for a, b in zip(vis.shape[:2], finite.shape[:2])) + (rows,)  # (no sympy import)
    return torch.cat((vis.expand(*shape, n_k), finite.expand(*shape, 1)), -1)


def _grouped_bias(t: torch.Tensor, shapes: Shapes, heads: slice) -> torch.Tensor:
    """A (B or 1, Hq or 1, R, Nk) bias as (p or 1, G or 1, R, Nk) for the flattened K/V heads ``heads``."""
    if t.shape[0] == 1 and t.shape[1] == 1:
        return t
    full = t.expand(shapes.batch, shapes.heads_q, *t.shape[2:])
    return full.reshape(shapes.batch * shapes.heads_kv, shapes.group, *t.shape[2:])[heads]


def _bias_block(variant, shapes: Shapes, rows, heads: slice, vis, device):
    """(bias, size, vis) of one block: the variant's bias and its rounding magnitude (None without one),
    and ``vis`` with the keys a -inf bias hides masked (the bias is 0 there)."""
    if variant is None or not variant.biased:
        return None, None, vis
    bias = _grouped_bias(variant.bias(shapes.n_q, shapes.n_k, rows, device), shapes, heads)
    size = _grouped_bias(variant.bias(shapes.n_q, shapes.n_k, rows, device, size=True), shapes, heads)
    hidden = bias == -math.inf
    if bool(hidden.any()):
        vis = ~hidden if vis is None else vis & ~hidden
        bias = bias.masked_fill(hidden, 0.0)
    return bias, size, vis


@dataclass(frozen=True)
class AttentionCall:
    """One attention call as the numerics compute on it: q (B, Hq, Nq, D), k and v (B, Hkv, Nk, .) as they
    are walked (fp8 already dequantized where the caller wants the values), validated with their ``shapes``;
    ``variant`` None for plain attention."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    causal: str
    attn_mask: torch.Tensor | None
    shapes: Shapes
    variant: Variant | None = None
    slack: tuple | None = None  # (q's, k's) of a kernel that quantizes inside (:class:`Block`)

    def dequantized(self) -> AttentionCall:
        """The call with fp8 q, k and v as the values they stand for (:func:`dequantized`), or, for a kernel
        that quantizes inside, as its quantizer's emulation gives them (:mod:`.quantized_inside`)."""
        scheme = None if self.variant is None else self.variant.quantization
        if scheme is not None and scheme.quantizer:
            inside = inside_values(scheme, self.q, self.k, self.v, scale=self.scale)
            return replace(self, q=inside.q, k=inside.k, v=inside.v, slack=inside.slack)
        q, k, v = dequantized(self.q, self.k, self.v, self.variant)
        return replace(self, q=q, k=k, v=v)


def iter_blocks(ops, call: AttentionCall, rows_all: torch.Tensor, *, allow_none: bool = False,
                cap: int | None = None):
    """The attention call in as few blocks as memory allows (usually one), with float64 operands.

    ``allow_none``: a block whose keys are all visible gets ``vis=None`` (see :func:`visible_block`).
    ``cap`` overrides the elements of one work array (:func:`block_elements`). The call's variant
    restricts ``vis`` by its keys (see :class:`Block`).
    """
    shapes, variant, device = call.shapes, call.variant, call.q.device
    Q_all, K_all, V_all = _grouped(shapes, call.q, call.k, call.v)
    slack_all = None if call.slack is None else _grouped(shapes, *call.slack, call.v)[:2]
    R, P = rows_all.numel(), shapes.batch * shapes.heads_kv
    head_step, row_step = _steps(shapes, R, cap or block_elements(device))
    in_order = R == shapes.n_q and torch.equal(rows_all, torch.arange(R))
    for p0 in range(0, P, head_step):
        heads = slice(p0, p0 + head_step)
        Q = ops.asarray(Q_all[heads])  # only these heads in float64: memory bounded on long rows
        K, V, sink = _sink_key(ops, shapes, ops.asarray(K_all[heads]), ops.asarray(V_all[heads]), variant, device,
                               heads)
        for r0 in range(0, R, row_step):
            rows = rows_all[r0:r0 + row_step]
            vis = visible_block(call.causal, call.attn_mask, shapes, rows, device, heads=heads, allow_none=allow_none,
                                variant=variant)
            bias, size, vis = _bias_block(variant, shapes, rows, heads, vis, device)
            if sink is not None:
                vis = _with_sink_column(vis, sink, rows.numel(), shapes.n_k)
            pick = slice(r0, r0 + row_step) if in_order else ops.mask(rows.to(device))
            slack = None if slack_all is None else (ops.asarray(slack_all[0][heads])[:, :, pick],
                                                     ops.asarray(slack_all[1][heads]))
            yield Block(heads, slice(r0, r0 + rows.numel()), Q[:, :, pick], K, V,
                        None if vis is None else ops.mask(vis), None if variant is None else variant.cap, sink,
                        None if bias is None else ops.asarray(bias), None if size is None else ops.asarray(size),
                        variant is not None and variant.bias_order == "bias_first", slack)


def scatter(ops, outputs, block: Block, results) -> None:
    """Write one block's results into the (B, Hq, R, ...) output tensors."""
    for dst, src in zip(outputs, results):
        grouped = dst.view(-1, block.Q.shape[1], *dst.shape[2:])  # (P, G, R, ...)
        ops.store(grouped, (block.heads, slice(None), block.sl), src)


def add_into(ops, target: torch.Tensor, index, value) -> None:
    """``target[index] += value``, for a numpy block (through the tensor's memory) or a torch one."""
    if isinstance(value, np.ndarray):
        view = target.numpy()[index]  # a CPU tensor shares its memory with this array
        view += value.reshape(view.shape)
    else:
        target[index] += value.reshape(target[index].shape)
