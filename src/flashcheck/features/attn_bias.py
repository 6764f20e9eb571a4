"""An additive bias: ``attn_bias`` (spec ``attn_bias=True``), a float tensor broadcastable to (B, Hq, Nq, Nk), in the
inputs' dtype (or fp32 where the spec says ``fp32_bias=True``), added to the scaled logits; -inf hides a key.

Its regimes are drawn from where reported bugs cluster: biases broadcast every way, hiding keys and whole
rows, at the dtype's lowest value and below the finite sentinels kernels use for "masked"."""

from __future__ import annotations

import math

import torch

from ..contract.formats import format_of
from ..contract.validation import broadcasts_to
from ..errors import InvalidArgument
from .base import Feature
from .scores import RowTerms
from .tensors import as_float_tensor

__all__ = ["BIAS_LIMIT", "FEATURE", "WIDE_BIASES", "attn_bias_bias", "attn_bias_score"]

BIAS_LIMIT = 1 << 22  # elements: past it, a bias keeps fewer of (B, Hq, Nq, Nk) (long rows), as _dims drops them
WIDE_BIASES = ("below_1e30",)  # regimes past fp16's range: an fp16 bias cannot hold them


def _check(bias):
    if bias is None:
        return None
    fix = ("Pass attn_bias as a float tensor broadcastable to (B, Hq, Nq, Nk) in the inputs' dtype (or fp32); "
           "-inf hides a key.")
    t = as_float_tensor("attn_bias", bias, fix, (1, 2, 3, 4))
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise InvalidArgument("attn_bias", t.dtype, "expected float16, bfloat16 or float32", fix)
    return t.to("cpu").clone()


def _shape_problem(bias, shapes):
    full = (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k)
    if not broadcasts_to(tuple(bias.shape), full):
        return (tuple(bias.shape), f"does not broadcast to {full} (B, Hq, Nq, Nk)",
                "Pass a bias whose every dim is 1 or the size of (B, Hq, Nq, Nk).")
    return None


def _refusal(variant, spec, dtype):
    bias = variant.attn_bias
    if bias.dtype != dtype and not (bias.dtype == torch.float32 and spec.fp32_bias):
        return f"attn_bias in {bias.dtype}, inputs in {dtype} (the spec does not declare fp32_bias=True)"
    return None


def _bias(variant, n_q: int, n_k: int, rows: torch.Tensor, device, size: bool):
    """The bias of ``rows`` in float64; with ``size``, |bias| (a hidden key rounds nothing)."""
    bias = variant.attn_bias.to(device, torch.float64)
    bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
    bias = bias if bias.shape[2] == 1 else bias.index_select(2, rows)
    return bias.abs().nan_to_num(posinf=0.0) if size else bias


def _bias_extent(variant, n_q: int, n_k: int) -> float:
    """The largest |bias| (a hidden key rounds nothing)."""
    return float(variant.attn_bias.abs().nan_to_num(posinf=0.0).max())


def _misreads(variant, row: RowTerms) -> list:
    scaled = row.biases["attn_bias"] * row.scale
    return [("attn_bias ignored", row.logits(biases={"attn_bias": None})),
            ("attn_bias multiplied by the softmax scale", row.logits(biases={"attn_bias": scaled}))]


def _row_shift(bias, shift: torch.Tensor, shapes, dtype):
    """``bias`` plus ``shift`` in its dtype (a bias of ``shift`` in ``dtype`` where there is none); None where a
    sum is not exact (then the exact output would move)."""
    if bias is None:
        return shift.to(dtype)
    wanted = torch.broadcast_to(bias.double(), (shapes.batch, shapes.heads_q, shapes.n_q, shapes.n_k)) + shift
    shifted = wanted.to(bias.dtype)
    if not bool(((shifted.double() == wanted) | (wanted == -math.inf)).all()):
        return None
    return shifted


def attn_bias_bias(bias, n_q, n_k, dtype, settings):
    """The bias in ``dtype``, with four dims. Torch only: a reproducer script copies it."""
    return bias.to(dtype).reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))


def attn_bias_score(bias, full, offset, settings):
    """The bias's term of flex's score_mod, read at [b, h, q_idx, kv_idx] of its (B, Hq, Nq, Nk) broadcast. Torch
    only: a reproducer script copies it."""
    bias = bias.expand(full)
    return lambda score, b, h, q_idx, kv_idx: score + bias[b, h, q_idx, kv_idx]


def _draw(name: str, regime, gen, shapes, settings) -> torch.Tensor:
    """The regime's bias rounded to the recipe's ``bias_dtype``; an error where a finite value would round to
    infinity."""
    fmt = format_of(settings["bias_dtype"], argument="bias_dtype")
    bias = regime(gen, shapes, fmt.dtype)
    out = bias.to(fmt.dtype)
    if bool((torch.isinf(out) & torch.isfinite(bias)).any()):
        raise InvalidArgument("attn_bias regime", name, f"its values lie past {fmt.name}'s range",
                              "Draw it with an fp32 bias (a kernel spec with fp32_bias=True) or bf16 or fp32 inputs.")
    return out.contiguous()


def _settings(spec, dtype: str, regime: str, choose) -> dict | None:
    """The bias's dtype: the inputs', or fp32 where the spec takes it (always for a regime past fp16's range, which an
    fp16 bias cannot hold); None where neither holds the regime."""
    wide = regime in WIDE_BIASES
    if spec.fp32_bias and dtype != "fp32":
        dtype = "fp32" if wide else choose((dtype, "fp32"))
    return None if wide and dtype == "fp16" else {"bias_dtype": dtype}


def _dims(s, pattern: str = "bhqk", drop: str = "bhq") -> tuple[int, ...]:
    """The bias shape of ``pattern`` (b, h, q, k: B, Hq, Nq, Nk; 1: broadcast), with the dims of ``drop``
    set to 1 in turn while it holds more than :data:`BIAS_LIMIT` elements."""
    size = {"b": s.batch, "h": s.heads_q, "q": s.n_q, "k": s.n_k, "1": 1}
    dims = [size[c] for c in pattern]
    for c in drop:
        if math.prod(dims) <= BIAS_LIMIT:
            break
        dims = [1 if p == c else d for p, d in zip(pattern, dims)]
    return tuple(dims)


def _normal(pattern: str = "bhqk", sigma: float = 1.0):
    return lambda gen, s, dtype: sigma * torch.randn(_dims(s, pattern), generator=gen)


def _rows(value):
    """N(0, 1), with every key of about half the rows at ``value(dtype)``."""
    def draw(gen, s, dtype):
        b = torch.randn(_dims(s, drop="bhk"), generator=gen)
        return b.masked_fill(torch.rand(b.shape[:-1] + (1,), generator=gen) < 0.5, value(dtype))
    return draw


def _hidden_keys(gen, s, dtype) -> torch.Tensor:
    b = torch.randn(_dims(s), generator=gen)
    return b.masked_fill(torch.rand(b.shape, generator=gen) < 0.3, -math.inf)


def _lowest(gen, s, dtype) -> torch.Tensor:
    """fp16's lowest finite value, -65504, on random keys and on every key of some rows: a bias added in
    fp16 overflows to -inf and hides keys that are visible. (fp32's lowest is no test: past 2.4e38 a
    logit overflows the base-2 domain that legal kernels compute in.)"""
    b = torch.randn(_dims(s), generator=gen)
    hit = (torch.rand(b.shape, generator=gen) < 0.3) | (torch.rand(b.shape[:-1] + (1,), generator=gen) < 0.25)
    return b.masked_fill(hit, torch.finfo(torch.float16).min)


def _dominant(gen, s, dtype) -> torch.Tensor:
    """|b| of 10^3..10^4, either sign: the bias decides the softmax (a bias scaled with the logits shows)."""
    dims = _dims(s)
    sign = torch.where(torch.rand(dims, generator=gen) < 0.5, -1.0, 1.0)
    return sign * 10 ** (3 + torch.rand(dims, generator=gen))


def _row_constant(gen, s, dtype) -> torch.Tensor:
    """One value for every key of a row, stored full: O unchanged, lse moved by it."""
    dims = _dims(s, drop="bhk")
    return (8 * torch.randn(dims[:3] + (1,), generator=gen)).expand(dims).contiguous()


FEATURE = Feature(
    name="attn_bias", flag="attn_bias", term="bias", summary="a float bias added to the scaled logits",
    check=_check, text=lambda value: f"{tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}",
    tensor=True, dims=lambda value: (-4, -3), shape_problem=_shape_problem, refusal=_refusal, bias=_bias,
    draw=_draw, misreads=_misreads, gradient="dbias",
    bias_extent=_bias_extent,
    settings=_settings, saved_dtype=None, serving=False,  # a serving form packs the positions the bias lies over
    script={"bias": attn_bias_bias, "score_mod": attn_bias_score},
    # logits of the value regimes sit near 0..10
    regimes={
        "none": None,
        "random": _normal(),  # full (B, Hq, Nq, Nk): a bias read at the wrong batch, head, row or key
        "keys": _normal("111k", 2.0),  # stride-0 dims misread
        "per_batch": _normal("b1qk", 2.0),
        "per_row": _normal("1hq1", 2.0),  # one value a row: only lse shows it
        "matrix": _normal("qk", 2.0),  # 2-D, right-aligned
        "hidden_keys": _hidden_keys,  # -inf as a mask: NaN from -inf - -inf
        "hidden_rows": _rows(lambda dtype: -math.inf),  # rows with no visible key: O = 0, lse = -inf
        "lowest": _lowest,
        "below_5e4": _rows(lambda dtype: -6e4),  # a finite "masked" sentinel (-5e4, fp16's -inf stand-in) empties rows
        "below_1e30": _rows(lambda dtype: -1e31),  # a running max started at -1e30 never moves: l = 0
        "dominant": _dominant,
        "row_constant": _row_constant,
    },
    row_shift=_row_shift,
)
