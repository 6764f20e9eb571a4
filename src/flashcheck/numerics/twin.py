"""A precision-faithful twin: the tiled flash algorithm in plain torch, rounding where a contract says.

The twin runs the online-softmax algorithm (running max, running sum, rescaled fp32 accumulator) with
the tile sizes and key order as parameters, and rounds exactly where the precision contract allows a
kernel to round: P to the input dtype before P @ V, tf32 operands for fp32 inputs, the output at the
end. Its errors over several tilings and key orders are an empirical envelope of legal reordering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..contract.counts import check_count
from ..contract.masks import visible
from ..contract.precision import Precision, precision_named
from ..contract.validation import check_attention_inputs
from ..errors import InvalidArgument
from ..features.scores import bias_after_cap, capped_scores
from .blockwise import by_group

__all__ = ["Defect", "Habits", "Tiling", "twin_attention", "round_tf32"]

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class Tiling:
    """The tiles of the online softmax, ``block_m`` query rows by ``block_n`` keys, and the order the keys
    are visited in (``key_order``, a permutation of them; None: in order)."""

    block_m: int = 64
    block_n: int = 64
    key_order: torch.Tensor | None = None


@dataclass(frozen=True)
class Habits:
    """How a kernel computes where its contract leaves it the choice, each rounding differently.

    ``tf32_mode``: how fp32 operands are rounded to tf32 (``"nearest"`` or ``"truncate"``). ``scale_inputs``
    multiplies Q and K by sqrt(|scale|) before the product instead of scaling the scores (PyTorch's math
    backend does). ``softmax_first`` (one-pass contracts only) normalises the weights before P @ V, as
    softmax-then-matmul does, instead of dividing the output by l. ``tanh_from_exp`` computes the cap's tanh
    as ``1 - 2 / (exp(2x) + 1)`` in fp32, as kernels without a tanh do. ``bias_base2`` adds each of the
    variant's bias terms to the base-2 logits, ``s log2(e) + b log2(e)``, as exp2 kernels do, instead of
    ``(s + b) log2(e)``: the two round differently where |b| is large. ``sequential`` (one-pass contracts only)
    accumulates each dot product of Q @ K^T and P @ V one term at a time in fp32, as a CPU's BLAS does: where the
    terms' roundings share a sign their errors add up, where a GPU's BLAS sums in a tree and most of them cancel
    (on an fp32 case of 364 keys, 0.216 of the budget against 0.017), and either order is legal. ``defect`` is
    no habit but a mistake (:class:`Defect`), committed by the defect models; the twin then always walks key tiles
    (a one-pass contract's P stays in fp32).
    """

    tf32_mode: str = "nearest"
    scale_inputs: bool = False
    softmax_first: bool = False
    tanh_from_exp: bool = False
    bias_base2: bool = False
    sequential: bool = False
    defect: "Defect | None" = None


def _same(x):
    return x


@dataclass(frozen=True)
class Defect:
    """One mistake a kernel can make, at the twin's named points of the tiled algorithm (the defaults: none).

    It turns the twin into a defect model (:mod:`flashcheck.defects`): ``dot`` forms Q @ K^T from (B, Hq, R, D) and
    (B, Hkv, D, C) fp32 operands; ``scores`` rounds its fp32 result; ``logits`` rounds the base-2 logits after the
    scale (a kernel that multiplies half-precision scores by the scale in half); ``logit_factor`` multiplies the scale;
    ``prescale`` rounds Q times the scale before the product (the scale then 1); ``p`` rounds the weights before
    P @ V in place of the contract's rounding; ``acc`` and ``row_sum`` round the accumulator and l after each key
    tile; ``carry_max``, ``rescale_acc`` and ``rescale_sum`` drop the online softmax's carried max and its two
    rescales; ``exp_p`` is the exponential of the weights (base 2); ``masked_logit`` adds a finite value to each
    hidden key's logit (natural units) instead of hiding it; ``lse`` maps the natural lse and the row max (m, base
    2) to the lse returned.
    """

    dot: object = None
    scores: object = _same
    logits: object = _same
    logit_factor: float = 1.0
    prescale: object = None
    p: object = None
    acc: object = _same
    row_sum: object = _same
    carry_max: bool = True
    rescale_acc: bool = True
    rescale_sum: bool = True
    exp_p: object = torch.exp2
    masked_logit: float | None = None
    lse: object = None


def round_tf32(x: torch.Tensor, *, mode: str = "nearest") -> torch.Tensor:
    """fp32 values rounded to tf32's 10 explicit mantissa bits (``"nearest"`` or ``"truncate"``)."""
    bits = x.float().contiguous().view(torch.int32)
    if mode == "nearest":
        bits = bits + 0x1000  # half of the dropped 13 bits; carries into the exponent like hardware
    elif mode != "truncate":
        raise InvalidArgument("mode", mode, "unknown tf32 rounding", "Use 'nearest' or 'truncate'.")
    finite = torch.isfinite(x.float())
    rounded = (bits & ~0x1FFF).view(torch.float32)
    return torch.where(finite, rounded, x.float())


def twin_attention(q, k, v, *, scale: float, causal: str = "none", attn_mask=None,
                   precision: Precision | str = "flash", variant=None, tiling: Tiling = Tiling(),
                   habits: Habits = Habits()):
    """(out, lse) of the tiled algorithm under ``precision``, in ``tiling``'s tiles and key order, computed
    with a kernel's ``habits``; ``variant``'s cap and bias on the logits, its visible keys, and its sink added
    to l at the end. Fully masked rows give out = 0 and lse = -inf, as a careful kernel does. ``habits.defect``
    makes the twin commit that mistake.
    """
    q, k, v, scale, causal, attn_mask, s = check_attention_inputs(q, k, v, scale=scale, causal=causal,
                                                                  attn_mask=attn_mask)
    precision = precision_named(precision)
    _check_knobs(precision, tiling, habits)
    defect = habits.defect
    dtype = q.dtype
    tf32 = precision.tf32 and dtype == torch.float32
    vis = visible(causal, attn_mask, (s.batch, s.heads_q, s.n_q, s.n_k), device=q.device, variant=variant)
    kq, vq = k.float(), v.float()  # one copy a K/V head: its query heads are rows of one matmul (_by_group)
    qf = q.float()
    if defect is not None:
        qf, scale = _defect_scale(defect, qf, scale, dtype)
    if habits.scale_inputs:
        root = math.sqrt(abs(scale))
        qf, kq = qf * math.copysign(root, scale), kq * root
        scale = 1.0
    scores = _Scores.of(variant, scale, q.device, habits.tanh_from_exp, s)
    scores.base2 = habits.bias_base2
    if tiling.key_order is not None:
        order = torch.as_tensor(tiling.key_order, device=q.device, dtype=torch.long)
        if sorted(order.tolist()) != list(range(s.n_k)):
            raise InvalidArgument("key_order", tiling.key_order, "not a permutation of the keys",
                                  f"Pass a permutation of range({s.n_k}).")
        kq, vq, vis = kq[:, :, order], vq[:, :, order], vis[..., order]
        scores.permute_keys(order)
    if tf32:
        qf, kq, vq = (round_tf32(t, mode=habits.tf32_mode) for t in (qf, kq, vq))
    if not precision.rescales_per_tile and defect is None:
        matmul = _sequential_by_group if habits.sequential else by_group
        return _upcast(qf, kq, vq, vis, scores, dtype, habits.softmax_first, matmul)
    p_rounding = _p_rounding(precision, dtype, tf32, habits.tf32_mode)
    if defect is not None and defect.p is not None:
        p_rounding = defect.p
    return _tiled(qf, kq, vq, vis, scores, s, dtype=dtype, p_rounding=p_rounding, tiling=tiling,
                  defect=defect or Defect())


def _defect_scale(defect: Defect, qf, scale: float, dtype):
    """Q and the scale as the defect leaves them: the scale multiplied, or folded into Q and rounded."""
    scale = scale * defect.logit_factor
    if defect.prescale is None:
        return qf, scale
    return defect.prescale(qf * scale).float(), 1.0


def _check_knobs(precision: Precision, tiling: Tiling, habits: Habits) -> None:
    """Tiles of a positive size, and only the habits the contract allows a kernel."""
    for name in ("block_m", "block_n"):
        check_count(name, getattr(tiling, name), what="a tile size", fix=f"Pass {name}=16, 32, 64, ...")
    if habits.scale_inputs and not precision.scale_on_inputs:
        raise InvalidArgument("scale_inputs", habits.scale_inputs, f"the {precision.name!r} contract scales the "
                              "scores, not Q and K",
                              "Pass scale_inputs only with a contract that has scale_on_inputs=True.")
    if (habits.softmax_first or habits.sequential) and precision.rescales_per_tile:
        name = "softmax_first" if habits.softmax_first else "sequential"
        raise InvalidArgument(name, True, f"the {precision.name!r} contract rescales per tile: its twin's "
                              "tiles set the order of the sums and the normalisation",
                              f"Pass {name} only with a one-pass contract such as 'upcast'.")


def _p_rounding(precision: Precision, dtype, tf32: bool, tf32_mode: str):
    """How the contract rounds P before P @ V (None: it stays in fp32)."""
    if precision.p_dtype != "input":
        return None
    return (lambda p: round_tf32(p, mode=tf32_mode)) if tf32 else (lambda p: p.to(dtype).float())


def _tiled(qf, kq, vq, vis, scores, s, *, dtype, p_rounding, tiling: Tiling, defect: Defect = Defect()):
    """The online softmax over key tiles of ``block_n``: (out, lse), with ``defect``'s mistake."""
    block_m, block_n = tiling.block_m, tiling.block_n
    out = torch.empty(s.batch, s.heads_q, s.n_q, s.head_dim_v, dtype=dtype, device=qf.device)
    lse = torch.empty(s.batch, s.heads_q, s.n_q, dtype=torch.float32, device=qf.device)
    # Rows are independent in the online softmax, so block_m changes no number: rows go through in
    # multiples of block_m as large as memory allows, and only the key tiling and order shape the rounding.
    per_row = s.batch * s.heads_q * max(block_n, s.head_dim_v)
    step = block_m * max(1, (1 << 24) // max(per_row * block_m, 1))
    for m0 in range(0, s.n_q, step):
        rows = slice(m0, m0 + step)
        qb = qf[:, :, rows]
        m = torch.full(qb.shape[:-1] + (1,), -math.inf, device=qf.device)
        l = torch.zeros_like(m)
        acc = torch.zeros(qb.shape[:-1] + (s.head_dim_v,), device=qf.device)
        dot = defect.dot or by_group
        tiles = _seen_tiles(vis[:, :, rows], block_n) if defect.masked_logit is None else range(0, s.n_k, block_n)
        for n0 in tiles:
            cols = slice(n0, n0 + block_n)
            qk = defect.scores(dot(qb, kq[:, :, cols].transpose(-1, -2)))
            s2 = defect.logits(scores.log2(qk, rows, cols))  # log2 domain, fp32
            hidden = -math.inf if defect.masked_logit is None else s2 + defect.masked_logit * LOG2E
            s2 = torch.where(vis[:, :, rows, cols], s2, hidden)
            tile_max = s2.amax(-1, keepdim=True)
            m_new = torch.maximum(m, tile_max) if defect.carry_max else tile_max
            safe = torch.where(m_new == -math.inf, 0.0, m_new)  # a row with nothing visible yet
            alpha = torch.exp2(m - safe)
            p = scores.counted(defect.exp_p(s2 - safe), rows, cols)
            l = defect.row_sum((l * alpha if defect.rescale_sum else l) + p.sum(-1, keepdim=True))
            p = p if p_rounding is None else p_rounding(p)
            # Keys no row sees are not read (a careful kernel's masked V load): 0 * NaN from poisoned or
            # uninitialised memory would otherwise poison the product.
            vt = vq[:, :, cols]  # a finite sentinel reads every key's V
            pv = by_group(p, vt if defect.masked_logit is not None else
                          torch.where(_seen_keys(vis[:, :, rows, cols], s.heads_kv), vt, 0.0))
            acc = defect.acc((acc * alpha if defect.rescale_acc else acc) + pv)
            m = m_new
        m, l, acc = scores.with_sink(m, l, acc)
        empty = l == 0
        o = torch.where(empty, 0.0, acc / torch.where(empty, 1.0, l))
        out[:, :, rows] = o.to(dtype)
        natural = torch.where(empty, -math.inf, (m + torch.log2(torch.where(empty, 1.0, l))) / LOG2E)
        lse[:, :, rows] = (natural if defect.lse is None else defect.lse(natural, m))[..., 0]
    return out, lse


def _seen_keys(vis, heads_kv: int):
    """(B or 1, Hkv or 1, Nk, 1): the keys some row of some query head of each K/V head sees in ``vis``
    (B or 1, Hq or 1, R, Nk). A key no row sees is not read: 0 * NaN from poisoned or uninitialised memory would
    poison the product."""
    seen = vis.any(dim=2)
    if seen.shape[1] > 1 and seen.shape[1] != heads_kv:
        seen = seen.unflatten(1, (heads_kv, -1)).any(2)
    return seen.unsqueeze(-1)


def _seen_tiles(vis, block_n: int) -> list[int]:
    """The starts of the key tiles that some row of ``vis`` (B or 1, Hq or 1, rows, Nk) sees. A tile no row sees
    changes no number: its weights are 0 and its rescale factor exp2(m - m) = 1, or l and acc stay 0 while m is
    -inf. Skipping it spares a long masked row (a window, a chunk, padding) most of its tiles; one sync a block."""
    n_k = vis.shape[-1]
    seen = vis.reshape(-1, n_k).any(0)
    per_tile = torch.nn.functional.pad(seen, (0, -n_k % block_n)).view(-1, block_n).any(1)
    return (per_tile.nonzero().flatten() * block_n).tolist()


class _Scores:
    """The twin's logits from Q K^T in fp32: scaled, capped and biased as the variant says (in the natural
    log domain, where the cap is defined), and the variant's sink logits, (1, Hq, 1, 1) fp32. The bias is
    (B or 1, Hq or 1, Nq or 1, Nk or 1) fp32, 0 where it hides a key (the visibility has those)."""

    def __init__(self, scale: float, cap, sink, device, tanh_from_exp: bool, bias=None, late: bool = False):
        self.scale = torch.tensor(scale, dtype=torch.float32, device=device)
        self.qk_scale = torch.tensor(scale * LOG2E, dtype=torch.float32, device=device)
        self.cap, self.sink, self.tanh_from_exp = cap, sink, tanh_from_exp
        self.bias, self.late = bias, late  # late: the bias is added to the capped logits
        self.base2 = False  # the biases added to the base-2 logits (where no cap comes after them)
        self.parts = []  # each bias feature's term apart (fp32, hidden keys 0), as a kernel adds them one by one
        self.multiplicity = None  # how often each key is counted, (B, 1, Nq, Nk) fp32, where a feature weighs keys

    @classmethod
    def of(cls, variant, scale: float, device, tanh_from_exp: bool = False, shapes=None) -> "_Scores":
        cap = None if variant is None else variant.cap
        sink = None if variant is None or variant.sink is None else variant.sink.to(device).view(1, -1, 1, 1)
        bias, parts, weights = None, [], []
        if variant is not None and variant.biased:
            rows = torch.arange(shapes.n_q).to(device)
            for f in variant.biasing():
                term = f.bias(variant, shapes.n_q, shapes.n_k, rows, device, False)
                (parts if f.term == "bias" else weights).append(term)
            bias = _fp32_bias(sum(parts)) if parts else None
            parts = [_fp32_bias(part) for part in parts]
        late = bias_after_cap(bias is not None, cap, variant.bias_order if variant is not None else "cap_first")
        scores = cls(scale, cap, sink, device, tanh_from_exp, bias, late)
        scores.parts = parts
        # A key listed c times is c terms of a gathering kernel's sums: its weight is multiplied by c after the
        # exponential (exact in fp32), where adding log c to the logit would round otherwise.
        scores.multiplicity = torch.exp(sum(weights)).round().float() if weights else None
        return scores

    def tanh(self, x):
        if not self.tanh_from_exp:
            return torch.tanh(x)
        return torch.sign(x) * (1 - 2 / (torch.exp(2 * x.abs()) + 1))

    def _bias_tile(self, rows, cols, bias=None):
        bias = self.bias if bias is None else bias
        bias = bias[:, :, rows if bias.shape[2] > 1 else slice(None)]
        return bias[..., cols if bias.shape[-1] > 1 else slice(None)]

    def permute_keys(self, order):
        """The biases along the keys in ``order`` (one broadcast along the keys stays)."""
        self.bias, self.multiplicity, *self.parts = (
            b if b is None or b.shape[-1] == 1 else b[..., order] for b in [self.bias, self.multiplicity, *self.parts])

    def counted(self, p, rows=slice(None), cols=slice(None)):
        """The weights ``p`` of ``rows`` and ``cols``, each key's counted as often as it is listed."""
        return p if self.multiplicity is None else p * self._bias_tile(rows, cols, self.multiplicity)

    def natural(self, qk, rows=slice(None), cols=slice(None)):
        bias = None if self.bias is None else self._bias_tile(rows, cols)
        return capped_scores(qk * self.scale, bias, self.cap, self.late, self.tanh)[1]

    def _capped(self, s):
        return self.cap * self.tanh(s / self.cap)

    def log2(self, qk, rows=slice(None), cols=slice(None)):
        if self.cap is None and self.bias is None:
            return qk * self.qk_scale  # one multiply, as a kernel folds log2(e) into the scale
        if self.base2 and self.bias is not None and (self.cap is None or self.late):
            s = qk * self.qk_scale if self.cap is None else self._capped(qk * self.scale) * LOG2E
            for part in self.parts:  # each bias term in registry order, rounded into the base-2 logits
                s = s + self._bias_tile(rows, cols, part) * LOG2E
            return s
        return self.natural(qk, rows, cols) * LOG2E

    def with_sink(self, m, l, acc):
        """The running max, sum and accumulator (log2 domain) with each row's sink added to the sum."""
        if self.sink is None:
            return m, l, acc
        sink = self.sink * LOG2E
        m_new = torch.maximum(m, sink)
        safe = torch.where(m_new == -math.inf, 0.0, m_new)
        alpha = torch.exp2(m - safe)
        return m_new, l * alpha + torch.exp2(sink - safe), acc * alpha


def _fp32_bias(bias):
    """A float64 bias as the twin adds it: fp32, 0 where it hides a key (the visibility has those)."""
    return bias.masked_fill(bias == -math.inf, 0.0).float()


def _sequential_by_group(a, b):
    """:func:`by_group` in fp32 with each inner sum taken one term at a time, each product and each sum rounded to
    fp32; numpy on the CPU, so that the order is the same on every device. Memory: one output and one product."""
    batch, heads_q, rows, inner = a.shape
    x = a.detach().cpu().numpy().reshape(batch, b.shape[1], heads_q // b.shape[1] * rows, inner)
    y = b.detach().cpu().numpy()
    acc = np.zeros(np.broadcast_shapes(x.shape[:2], y.shape[:2]) + (x.shape[2], y.shape[3]), dtype=np.float32)
    term = np.empty_like(acc)
    for i in range(inner):
        np.multiply(x[..., i, None], y[..., i, None, :], out=term)
        acc += term
    return torch.from_numpy(acc).to(a.device).view(acc.shape[0], heads_q, rows, -1)


def _upcast(qf, kq, vq, vis, scores, dtype, softmax_first, matmul=by_group):
    """Computed in fp32 and rounded once (PyTorch's math backend)."""
    s = torch.where(vis, scores.natural(matmul(qf, kq.transpose(-1, -2))), -math.inf)
    m = s.amax(-1, keepdim=True)
    if scores.sink is not None:
        m = torch.maximum(m, scores.sink)
    empty = m == -math.inf
    p = scores.counted(torch.exp(s - torch.where(empty, 0.0, m)))
    l = p.sum(-1, keepdim=True)
    if scores.sink is not None:
        l = l + torch.exp(scores.sink - torch.where(empty, 0.0, m))
    vq = torch.where(_seen_keys(vis, vq.shape[1]), vq, 0.0)
    if softmax_first:
        out = torch.where(empty, 0.0, matmul(p / torch.where(empty, 1.0, l), vq))
    else:
        out = torch.where(empty, 0.0, matmul(p, vq) / torch.where(empty, 1.0, l))
    lse = torch.where(empty, -math.inf, m + torch.log(torch.where(empty, 1.0, l)))[..., 0]
    return out.to(dtype), lse
