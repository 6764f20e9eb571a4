"""Attention variants: what a case asks of a kernel beyond plain softmax attention.

One logical problem per case: Q, K, V, the scale, a score transform, the visibility and optional sinks.
A kernel receives each part as a keyword argument, only when its spec declares it (a spec flag of the
same name) and the case uses it, so every kernel written for the plain calling convention keeps working:

- ``softcap=c`` (spec ``softcap=True``): the scaled logits s become ``c * tanh(s / c)`` (Gemma 2), before
  the masks hide any key. ``c = inf`` is no cap.
- ``alibi_slopes`` ((Hq,) or (B, Hq) fp32; spec ``alibi="symmetric"`` or ``"linear"``): a bias added to
  the scaled logits, ``-slope * |i + Nk - Nq - j|`` (flash-attention's) or ``slope * (j - i)`` (FlashInfer's
  and attention-gym's). The mode belongs to the kernel; a case records the one it was drawn for.
- ``attn_bias`` (spec ``attn_bias=True``): a float tensor broadcastable to (B, Hq, Nq, Nk), in the inputs'
  dtype (or fp32 where the spec says ``fp32_bias=True``), added to the scaled logits; -inf hides a key.
  Where a cap and a bias (ALiBi or ``attn_bias``) both apply, ``bias_order`` says which comes first:
  ``"cap_first"`` (``c tanh(s / c) + bias``, flash-attention's) or ``"bias_first"`` (``c tanh((s + bias) / c)``);
  the spec declares its kernel's, the case records it.
- ``window=(left, right)`` (spec ``window=True``): key j is visible to query i iff
  ``i + Nk - Nq - left <= j <= i + Nk - Nq + right``, bottom-right aligned as flash-attention's
  ``window_size``; -1 leaves a side unbounded. ``(Nk - 1, 0)`` is the bottom-right causal mask.
- ``chunk=c`` (spec ``chunk=True``): keys only in the query's chunk of positions, ``(i + Nk - Nq) // c ==
  j // c``, bottom-right aligned (Llama 4's chunked attention).
- ``sinks`` (spec ``sinks=True``): one fp32 logit per query head, (Hq,), added to each row's denominator:
  ``O_i = sum_j e^s_ij v_j / (sum_j e^s_ij + e^sink)`` and ``lse_i = log(sum_j e^s_ij + e^sink)`` (gpt-oss).
  A row with no visible key has ``O = 0`` and ``lse = sink``. A sink of -inf is no sink.
- ``descales`` (fp8 inputs only, no spec flag: an fp8 dtype brings them): (3, B, Hkv) fp32, the descales of
  q, k and v; a kernel receives them as ``q_descale``, ``k_descale``, ``v_descale`` ((B, Hkv) each, FA3's
  convention) and attends the dequantized values ``x8 * descale`` (:mod:`flashcheck.inputs.quantization`).

Window, chunk, causal alignment and boolean mask all restrict the keys a query sees; a key is visible
when every one of them allows it. The numerics see the variant through :meth:`Variant.visible` (the
keys) and the score transform and sinks (:mod:`flashcheck.numerics.oracle`), so every check, regime and
property applies to every variant.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

import torch

from ..errors import InvalidArgument
from .counts import check_count
from .features import ALIBI_MODES, BIAS_ORDERS, FEATURES
from .validation import broadcasts_to

__all__ = ["FEATURES", "SPEC_FLAGS", "Variant", "check_shapes", "check_variant", "declared", "unsupported_variant"]

SPEC_FLAGS = {f: ("alibi" if f == "alibi_slopes" else f) for f in FEATURES}
TENSORS = ("alibi_slopes", "attn_bias", "sinks", "descales")  # saved with the case's arrays, not its JSON
DESCALE_KWARGS = ("q_descale", "k_descale", "v_descale")
BIASES = ("alibi_slopes", "attn_bias")


def declared(spec) -> tuple[str, ...]:
    """The features ``spec`` declares, in :data:`FEATURES` order."""
    return tuple(f for f in FEATURES if getattr(spec, SPEC_FLAGS[f], False))


@dataclass(frozen=True, eq=False)
class Variant:
    """The variant parts of one case; the default is plain attention."""

    softcap: float | None = None
    alibi_slopes: torch.Tensor | None = None  # (Hq,) or (B, Hq) float32, on the CPU
    attn_bias: torch.Tensor | None = None  # float, broadcastable to (B, Hq, Nq, Nk), on the CPU
    window: tuple[int, int] | None = None
    chunk: int | None = None
    sinks: torch.Tensor | None = None  # (Hq,) float32, on the CPU
    alibi: str = "symmetric"  # how the slopes make a bias (ALIBI_MODES)
    bias_order: str = "cap_first"  # where a cap and a bias meet (BIAS_ORDERS)
    descales: torch.Tensor | None = None  # (3, B, Hkv) fp32 of fp8 inputs, on the CPU

    def __post_init__(self):
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        put("softcap", _check_softcap(self.softcap))
        put("alibi_slopes", _check_slopes(self.alibi_slopes))
        put("attn_bias", _check_bias(self.attn_bias))
        _check_choice("alibi", self.alibi, ALIBI_MODES)
        _check_choice("bias_order", self.bias_order, BIAS_ORDERS)
        if self.window is not None:
            put("window", _check_window(self.window))
        check_count("chunk", self.chunk, none_ok=True, what="a chunk length",
                    fix="Pass chunk=N keys per chunk (N >= 1), or None for no chunks.")
        put("sinks", _check_sinks(self.sinks))
        put("descales", _check_descales(self.descales))

    @property
    def used(self) -> tuple[str, ...]:
        """The features this case uses, in :data:`FEATURES` order."""
        return tuple(f for f in FEATURES if getattr(self, f) is not None)

    @property
    def restricts_keys(self) -> bool:
        return self.window is not None or self.chunk is not None

    @property
    def biased(self) -> bool:
        return self.alibi_slopes is not None or self.attn_bias is not None

    @property
    def capped(self) -> bool:
        return self.softcap is not None and math.isfinite(self.softcap)

    def kwargs(self, device=None) -> dict:
        """The keyword arguments a kernel receives (none for plain attention); tensors as fresh copies on
        ``device``, so a kernel writing into them cannot change the case."""
        out = {f: getattr(self, f) for f in self.used}
        for name in TENSORS:
            if name in out:
                out[name] = out[name].to(device or "cpu", copy=True)
        if self.descales is not None:
            out.update(zip(DESCALE_KWARGS, self.descales.to(device or "cpu", copy=True).unbind(0)))
        return out

    def bias(self, n_q: int, n_k: int, rows: torch.Tensor, device, *, size: bool = False):
        """The additive bias of ``rows`` in float64, ALiBi and ``attn_bias`` summed, broadcastable to
        (B, Hq, R, Nk) (-inf where ``attn_bias`` hides a key), or None without either.

        ``size``: instead, the magnitude a legal kernel's bias arithmetic rounds on: |attn_bias| plus
        |slope| (|i' - j| + |i'| + j), since a kernel may form the ALiBi term as slope * j - slope * i' (a
        per-row constant apart, the same softmax) and round each product."""
        out = None
        rows = rows.to(device)
        if self.alibi_slopes is not None:
            i = (rows + (n_k - n_q)).view(-1, 1).double() if self.alibi == "symmetric" else rows.view(-1, 1).double()
            j = torch.arange(n_k, device=device, dtype=torch.float64).view(1, -1)
            pos = -(i - j).abs() if self.alibi == "symmetric" else j - i
            pos = (i - j).abs() + i.abs() + j if size else pos
            slopes = self.alibi_slopes.to(device, torch.float64)
            slopes = slopes.abs() if size else slopes
            out = slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * pos
        if self.attn_bias is not None:
            bias = self.attn_bias.to(device, torch.float64)
            bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
            bias = bias if bias.shape[2] == 1 else bias.index_select(2, rows)
            bias = bias.abs().nan_to_num(posinf=0.0) if size else bias  # a hidden key rounds nothing
            out = bias if out is None else out + bias
        return out

    def visible(self, n_q: int, n_k: int):
        """The mask function (:mod:`~flashcheck.contract.masks` convention) of the keys the window and
        the chunk leave visible, or None when neither restricts them."""
        from . import masks

        parts = []
        if self.window is not None:
            parts.append(masks.window(*self.window, n_q=n_q, n_k=n_k))
        if self.chunk is not None:
            parts.append(masks.chunked(self.chunk, n_q=n_q, n_k=n_k))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else masks.and_masks(*parts)

    def select(self, batch: slice = slice(None), heads: slice = slice(None)) -> "Variant":
        """The variant of the batch entries ``batch`` and query heads ``heads`` of its case (the sinks,
        slopes and bias cut where they have those dims)."""
        def cut(t, dims):  # dims: the tensor's (batch, head) dims, None where it has none or broadcasts
            if t is None:
                return None
            index = [slice(None)] * t.dim()
            for dim, part in zip(dims, (batch, heads)):
                if dim is not None and t.dim() + dim >= 0 and t.shape[dim] > 1:
                    index[dim] = part
            return t[tuple(index)]
        slopes = self.alibi_slopes
        if self.descales is not None and heads != slice(None):
            raise InvalidArgument("heads", heads, "descales are per K/V head: a cut of query heads cannot keep them",
                                  "Select whole batch entries of an fp8 case.")
        return self.replace(sinks=cut(self.sinks, (None, -1)), attn_bias=cut(self.attn_bias, (-4, -3)),
                            alibi_slopes=cut(slopes, (-2, -1) if slopes is not None and slopes.dim() == 2
                                             else (None, -1)), descales=cut(self.descales, (-2, None)))

    def replace(self, **changes) -> "Variant":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        parts = [f"{f}={_text(f, getattr(self, f))}" for f in self.used]
        if self.alibi_slopes is not None:
            parts.append(f"alibi={self.alibi}")
        if self.biased and self.capped:
            parts.append(f"bias_order={self.bias_order}")
        if self.descales is not None:
            parts.append(f"descales={_text('descales', self.descales)}")
        return " ".join(parts)

    def equal_bits(self, other: "Variant") -> bool:
        if self.used != other.used or self.softcap != other.softcap or self.window != other.window:
            return False
        if self.chunk != other.chunk or self.alibi != other.alibi or self.bias_order != other.bias_order:
            return False
        return all(_same_bits(getattr(self, t), getattr(other, t)) for t in TENSORS)

    def as_dict(self) -> dict:
        """The scalar parts as JSON values (the tensors are saved with the case's arrays)."""
        out = {}
        if self.softcap is not None:
            out["softcap"] = self.softcap if math.isfinite(self.softcap) else "inf"
        if self.alibi_slopes is not None:
            out["alibi"] = self.alibi
        if self.biased and self.softcap is not None:
            out["bias_order"] = self.bias_order
        if self.window is not None:
            out["window"] = list(self.window)
        if self.chunk is not None:
            out["chunk"] = self.chunk
        return out

    @classmethod
    def from_dict(cls, data, tensors=None) -> "Variant":
        """The variant of :meth:`as_dict`'s ``data`` with its ``tensors`` (a dict of :data:`TENSORS`)."""
        data = {} if data is None else data
        if not isinstance(data, dict) or set(data) - {"softcap", "window", "chunk", "alibi", "bias_order"}:
            raise InvalidArgument("variant", data, "expected a dict of softcap, window, chunk, alibi and bias_order",
                                  "Pass e.g. {'window': [64, 0]}, {'chunk': 128} or {'softcap': 30.0}.")
        window, softcap = data.get("window"), data.get("softcap")
        tensors = {t: (tensors or {}).get(t) for t in TENSORS}
        return cls(softcap=math.inf if softcap == "inf" else softcap,
                   window=None if window is None else tuple(window), chunk=data.get("chunk"),
                   alibi=data.get("alibi", "symmetric"), bias_order=data.get("bias_order", "cap_first"), **tensors)


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _text(feature: str, value) -> str:
    if feature == "window":
        return f"({value[0]},{value[1]})"
    if feature in ("sinks", "alibi_slopes", "descales"):
        flat = value.flatten()
        return "[" + ",".join(f"{x:.4g}" for x in flat.tolist()[:4]) + (",..]" if flat.numel() > 4 else "]")
    if feature == "attn_bias":
        return f"{tuple(value.shape)}:{str(value.dtype).replace('torch.', '')}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise InvalidArgument(name, value, "unknown choice", f"Use one of {list(choices)}.")


def _as_float_tensor(name: str, value, fix: str, dims: tuple):
    try:
        t = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidArgument(name, value, "not a tensor", fix) from None
    if t.dim() not in dims or t.numel() == 0 or not t.is_floating_point():
        raise InvalidArgument(name, tuple(t.shape), f"expected a non-empty floating-point tensor of {dims} dims",
                              fix)
    if bool(torch.isnan(t).any()) or bool((t == math.inf).any()):
        raise InvalidArgument(name, value, "contains NaN or +inf", fix)
    return t.detach()


def _check_slopes(slopes):
    if slopes is None:
        return None
    fix = "Pass alibi_slopes as a finite float32 tensor of shape (Hq,) or (B, Hq)."
    t = _as_float_tensor("alibi_slopes", slopes, fix, (1, 2))
    if not bool(torch.isfinite(t).all()):
        raise InvalidArgument("alibi_slopes", slopes, "contains infinity", fix)
    return t.to("cpu", torch.float32).clone()


def _check_bias(bias):
    if bias is None:
        return None
    fix = ("Pass attn_bias as a float tensor broadcastable to (B, Hq, Nq, Nk) in the inputs' dtype (or fp32); "
           "-inf hides a key.")
    t = _as_float_tensor("attn_bias", bias, fix, (1, 2, 3, 4))
    if t.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise InvalidArgument("attn_bias", t.dtype, "expected float16, bfloat16 or float32", fix)
    return t.to("cpu").clone()


def _check_softcap(softcap):
    if softcap is None:
        return None
    if isinstance(softcap, numbers.Real) and not isinstance(softcap, bool) and softcap > 0:
        return float(softcap)
    raise InvalidArgument("softcap", softcap, "expected a positive number (math.inf: no cap)",
                          "Pass softcap=30.0, say, or None for no soft-capping.")


def _check_window(window) -> tuple[int, int]:
    fix = "Pass window=(left, right) with whole numbers >= -1 (-1: unbounded on that side)."
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise InvalidArgument("window", window, "expected a pair (left, right)", fix)
    return tuple(check_count("window", w, minimum=-1, what="a window side", fix=fix) for w in window)


def _check_descales(descales):
    if descales is None:
        return None
    fix = "Pass descales as a float32 tensor of shape (3, B, Hkv) (q's, k's and v's), finite and positive."
    t = _as_float_tensor("descales", descales, fix, (3,))
    if t.shape[0] != 3 or not bool((torch.isfinite(t) & (t > 0)).all()):
        raise InvalidArgument("descales", tuple(t.shape), "expected (3, B, Hkv), finite and positive", fix)
    return t.to("cpu", torch.float32).clone()


def _check_sinks(sinks):
    if sinks is None:
        return None
    fix = "Pass sinks as a float32 tensor of one logit per query head, shape (Hq,); -inf is no sink."
    try:
        t = torch.as_tensor(sinks)
    except (TypeError, ValueError, RuntimeError):
        raise InvalidArgument("sinks", sinks, "not a tensor", fix) from None
    if t.dim() != 1 or t.numel() == 0 or not t.is_floating_point():
        raise InvalidArgument("sinks", sinks, "expected a 1-D floating-point tensor of shape (Hq,)", fix)
    t = t.detach().to("cpu", torch.float32).clone()
    if bool(torch.isnan(t).any()) or bool((t == math.inf).any()):
        raise InvalidArgument("sinks", sinks, "contains NaN or +inf", fix)
    return t


def unsupported_variant(variant: Variant, spec, dtype) -> str | None:
    """Why ``spec`` cannot take ``variant`` (a feature it does not declare, another ALiBi mode or bias
    order, a bias dtype it does not accept), or None."""
    missing = [f for f in variant.used if f not in declared(spec)]
    if missing:
        return f"uses {missing}, which the kernel's spec does not declare"
    if variant.alibi_slopes is not None and variant.alibi != spec.alibi:
        return f"uses ALiBi {variant.alibi!r}, the kernel's spec declares alibi={spec.alibi!r}"
    if variant.biased and variant.capped and variant.bias_order != spec.bias_order:
        return f"uses bias_order={variant.bias_order!r}, the kernel's spec declares {spec.bias_order!r}"
    bias = variant.attn_bias
    if bias is not None and bias.dtype != dtype and not (bias.dtype == torch.float32 and spec.fp32_bias):
        return f"attn_bias in {bias.dtype}, inputs in {dtype} (the spec does not declare fp32_bias=True)"
    return None


def check_variant(variant: Variant, spec, *, shapes, dtype) -> None:
    """An :class:`InvalidArgument` when ``spec`` cannot take ``variant`` (:func:`unsupported_variant`) or its
    tensors do not fit the case's shapes (:func:`check_shapes`)."""
    why = unsupported_variant(variant, spec, dtype)
    if why:
        flags = ", ".join(f"alibi={variant.alibi!r}" if f == "alibi_slopes" else f"{f}=True" for f in variant.used)
        raise InvalidArgument("case", variant.describe(), why,
                              f"Declare what the case uses ({flags}) in the kernel's spec if it takes it, or "
                              "check a case without it.")
    check_shapes(variant, shapes)


def check_shapes(variant: Variant, shapes) -> None:
    """An :class:`InvalidArgument` unless the sinks give one logit per query head, the slopes one per query
    head (and batch entry), and the bias broadcasts to (B, Hq, Nq, Nk)."""
    B, Hq = shapes.batch, shapes.heads_q
    if variant.sinks is not None and variant.sinks.numel() != Hq:
        raise InvalidArgument("sinks", tuple(variant.sinks.shape), f"expected one sink per query head ({Hq})",
                              f"Pass sinks of shape ({Hq},).")
    slopes = variant.alibi_slopes
    if slopes is not None and tuple(slopes.shape) not in ((Hq,), (B, Hq)):
        raise InvalidArgument("alibi_slopes", tuple(slopes.shape), f"expected shape ({Hq},) or ({B}, {Hq})",
                              "Pass one slope per query head, or per batch entry and query head.")
    descales = variant.descales
    if descales is not None and tuple(descales.shape) != (3, B, shapes.heads_kv):
        raise InvalidArgument("descales", tuple(descales.shape), f"expected shape (3, {B}, {shapes.heads_kv})",
                              "Pass q's, k's and v's descales, one per batch entry and K/V head.")
    bias = variant.attn_bias
    full = (B, Hq, shapes.n_q, shapes.n_k)
    if bias is not None:
        if not broadcasts_to(tuple(bias.shape), full):
            raise InvalidArgument("attn_bias", tuple(bias.shape), f"does not broadcast to {full} (B, Hq, Nq, Nk)",
                                  "Pass a bias whose every dim is 1 or the size of (B, Hq, Nq, Nk).")
