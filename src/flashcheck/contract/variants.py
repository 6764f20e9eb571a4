"""Attention variants: what a case asks of a kernel beyond plain softmax attention.

One logical problem per case: Q, K, V, the scale, a score transform, the visibility and optional sinks.
A kernel receives each part as a keyword argument, only when its spec declares it (a spec flag of the
same name) and the case uses it, so every kernel written for the plain calling convention keeps working:

- ``softcap=c`` (spec ``softcap=True``): the scaled logits s become ``c * tanh(s / c)`` (Gemma 2), before
  the masks hide any key. ``c = inf`` is no cap.
- ``window=(left, right)`` (spec ``window=True``): key j is visible to query i iff
  ``i + Nk - Nq - left <= j <= i + Nk - Nq + right``, bottom-right aligned as flash-attention's
  ``window_size``; -1 leaves a side unbounded. ``(Nk - 1, 0)`` is the bottom-right causal mask.
- ``chunk=c`` (spec ``chunk=True``): keys only in the query's chunk of positions, ``(i + Nk - Nq) // c ==
  j // c``, bottom-right aligned (Llama 4's chunked attention).
- ``sinks`` (spec ``sinks=True``): one fp32 logit per query head, (Hq,), added to each row's denominator:
  ``O_i = sum_j e^s_ij v_j / (sum_j e^s_ij + e^sink)`` and ``lse_i = log(sum_j e^s_ij + e^sink)`` (gpt-oss).
  A row with no visible key has ``O = 0`` and ``lse = sink``. A sink of -inf is no sink.

Window, chunk, causal alignment and boolean mask all restrict the keys a query sees; a key is visible
when every one of them allows it. The numerics see the variant through :meth:`Variant.visible` (the
keys) and the score transform and sinks (:mod:`flashcheck.numerics.oracle`), so every check, regime and
property applies to every variant.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

from ..errors import InvalidArgument
from .counts import check_count

__all__ = ["FEATURES", "Variant", "check_heads", "check_variant"]

# In the order a kernel receives them, each also a spec flag of the same name.
FEATURES = ("softcap", "window", "chunk", "sinks")


@dataclass(frozen=True, eq=False)
class Variant:
    """The variant parts of one case; the default is plain attention."""

    softcap: float | None = None
    window: tuple[int, int] | None = None
    chunk: int | None = None
    sinks: torch.Tensor | None = None  # (Hq,) float32, on the CPU

    def __post_init__(self):
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        put("softcap", _check_softcap(self.softcap))
        if self.window is not None:
            put("window", _check_window(self.window))
        check_count("chunk", self.chunk, none_ok=True, what="a chunk length",
                    fix="Pass chunk=N keys per chunk (N >= 1), or None for no chunks.")
        put("sinks", _check_sinks(self.sinks))

    @property
    def used(self) -> tuple[str, ...]:
        """The features this case uses, in :data:`FEATURES` order."""
        return tuple(f for f in FEATURES if getattr(self, f) is not None)

    @property
    def restricts_keys(self) -> bool:
        return self.window is not None or self.chunk is not None

    def kwargs(self, device=None) -> dict:
        """The keyword arguments a kernel receives (none for plain attention); sinks as a fresh copy on
        ``device``, so a kernel writing into them cannot change the case."""
        out = {f: getattr(self, f) for f in self.used}
        if self.sinks is not None:
            out["sinks"] = self.sinks.to(device or "cpu", copy=True)
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

    def replace(self, **changes) -> "Variant":
        fields = {f: getattr(self, f) for f in FEATURES}
        fields.update(changes)
        return Variant(**fields)

    def describe(self) -> str:
        return " ".join(f"{f}={_text(f, getattr(self, f))}" for f in self.used)

    def equal_bits(self, other: "Variant") -> bool:
        if self.used != other.used or self.softcap != other.softcap or self.window != other.window:
            return False
        if self.chunk != other.chunk:
            return False
        return self.sinks is None or torch.equal(self.sinks.view(torch.int32), other.sinks.view(torch.int32))

    def as_dict(self) -> dict:
        """The scalar parts as JSON values (sinks, a tensor, are saved with the case's arrays)."""
        out = {}
        if self.softcap is not None:
            out["softcap"] = self.softcap if math.isfinite(self.softcap) else "inf"
        if self.window is not None:
            out["window"] = list(self.window)
        if self.chunk is not None:
            out["chunk"] = self.chunk
        return out

    @classmethod
    def from_dict(cls, data, sinks=None) -> "Variant":
        data = {} if data is None else data
        if not isinstance(data, dict) or set(data) - {"softcap", "window", "chunk"}:
            raise InvalidArgument("variant", data, "expected a dict of softcap, window and chunk",
                                  "Pass e.g. {'window': [64, 0]}, {'chunk': 128} or {'softcap': 30.0}.")
        window, softcap = data.get("window"), data.get("softcap")
        return cls(softcap=math.inf if softcap == "inf" else softcap,
                   window=None if window is None else tuple(window), chunk=data.get("chunk"), sinks=sinks)


def _text(feature: str, value) -> str:
    if feature == "window":
        return f"({value[0]},{value[1]})"
    if feature == "sinks":
        return "[" + ",".join(f"{x:.4g}" for x in value.tolist()[:4]) + (",..]" if value.numel() > 4 else "]")
    return f"{value:g}" if isinstance(value, float) else str(value)


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


def check_variant(variant: Variant, spec, *, heads_q: int) -> None:
    """An :class:`InvalidArgument` when ``spec`` does not declare a feature the case uses, or the sinks do
    not match the query heads."""
    missing = [f for f in variant.used if not getattr(spec, f, False)]
    if missing:
        raise InvalidArgument("case", variant.describe(), f"uses {missing}, which the kernel's spec does not declare",
                              f"Declare {', '.join(f'{m}=True' for m in missing)} in the kernel's spec if it "
                              "takes them, or check a case without them.")
    check_heads(variant, heads_q)


def check_heads(variant: Variant, heads_q: int) -> None:
    """An :class:`InvalidArgument` unless the sinks (if any) give one logit per query head."""
    if variant.sinks is not None and variant.sinks.numel() != heads_q:
        raise InvalidArgument("sinks", tuple(variant.sinks.shape), f"expected one sink per query head ({heads_q})",
                              f"Pass sinks of shape ({heads_q},).")
