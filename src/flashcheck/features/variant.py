"""Attention variants: what a case asks of a kernel beyond plain softmax attention, as one record.

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
- ``indices`` (spec ``key_sets``): int32 (B, Hkv or 1, Nq, topk), the keys each query attends, -1 as padding
  (:mod:`flashcheck.contract.key_sets`); a key is visible when its query's list names it.
- ``sinks`` (spec ``sinks=True``): one fp32 logit per query head, (Hq,), added to each row's denominator:
  ``O_i = sum_j e^s_ij v_j / (sum_j e^s_ij + e^sink)`` and ``lse_i = log(sum_j e^s_ij + e^sink)`` (gpt-oss).
  A row with no visible key has ``O = 0`` and ``lse = sink``. A sink of -inf is no sink.
- ``descales`` (fp8 inputs only, no spec flag: an fp8 dtype brings them): (3, B, Hkv) fp32, the descales of
  q, k and v; a kernel receives them as ``q_descale``, ``k_descale``, ``v_descale`` ((B, Hkv) each, FA3's
  convention) and attends the dequantized values ``x8 * descale`` (:mod:`flashcheck.inputs.quantization`).
  Where the spec's quantization scheme has block scales, the case's ``quantization`` names it and
  ``q_block_scales``, ``k_block_scales``, ``v_block_scales`` hold them (:mod:`flashcheck.features.quantized`).

Window, chunk, causal alignment and boolean mask all restrict the keys a query sees; a key is visible
when every one of them allows it. The numerics see the variant through :meth:`Variant.visible` (the
keys) and the score transform and sinks (:mod:`flashcheck.numerics.oracle`), so every check, regime and
property applies to every variant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..contract import masks
from ..contract.features import ALIBI_MODES, BIAS_ORDERS, DUPLICATES, FEATURES
from ..errors import InvalidArgument
from ..contract.quantization import scheme_named
from . import quantized
from .registry import REGISTRY, by_term
from .scores import finite_cap
from .tensors import as_float_tensor, head_values_text

__all__ = ["FEATURES", "RECIPE_SETTINGS", "SPEC_FLAGS", "TENSORS", "Variant", "check_shapes", "check_variant",
           "declared", "settings_of", "unsupported_variant"]

SPEC_FLAGS = {f.name: f.flag for f in REGISTRY}
# Saved with the case's arrays, not its JSON: the tensor features and an fp8 case's scales.
TENSORS = tuple(f.name for f in REGISTRY if f.tensor) + ("descales",) + quantized.BLOCK_SCALES
# The dtype each of TENSORS is saved in (None: the one the saved JSON gives with the shape).
SAVED_DTYPES = {**{f.name: f.saved_dtype for f in REGISTRY if f.tensor},
                **{name: "fp32" for name in ("descales",) + quantized.BLOCK_SCALES}}
DESCALE_KWARGS = quantized.DESCALE_KWARGS
SETTINGS = ("alibi", "bias_order", "duplicates")  # the JSON keys that are no feature: how slopes make a bias, cap and bias order
# What a recipe (flashcheck.inputs.recipe) records of the kernel's spec to draw a case's variant, in the order it saves
# them (None: the case has no such part): the ALiBi mode and the bias's dtype (those features' ``settings``),
# where a cap and a bias meet, and an fp8 case's block-scaled quantization scheme.
RECIPE_SETTINGS = ("alibi_mode", "bias_order", "bias_dtype", "block_size", "full_blocks", "duplicates",
                   "quantization")


def declared(spec) -> tuple[str, ...]:
    """The features ``spec`` declares, in registry order."""
    return tuple(f.name for f in REGISTRY if getattr(spec, f.flag, False))


@dataclass(frozen=True, eq=False)
class Variant:
    """The variant parts of one case; the default is plain attention."""

    softcap: float | None = None
    alibi_slopes: torch.Tensor | None = None  # (Hq,) or (B, Hq) float32, on the CPU
    attn_bias: torch.Tensor | None = None  # float, broadcastable to (B, Hq, Nq, Nk), on the CPU
    window: tuple[int, int] | None = None
    chunk: int | None = None
    indices: torch.Tensor | None = None  # (B, Hkv or 1, Nq, topk) int32, on the CPU
    block_lists: object = None  # a flashcheck.BlockLists (its tensors on the CPU)
    sinks: torch.Tensor | None = None  # (Hq,) float32, on the CPU
    alibi: str = "symmetric"  # how the slopes make a bias (ALIBI_MODES)
    duplicates: str = "once"  # how often a key listed twice in ``indices`` counts (DUPLICATES)
    bias_order: str = "cap_first"  # where a cap and a bias meet (BIAS_ORDERS)
    descales: torch.Tensor | None = None  # (3, B, Hkv) fp32 of fp8 inputs, on the CPU
    quantization: object = "per_head"  # the Scheme (or its name) of an fp8 case's scales (contract/quantization.py)
    q_block_scales: torch.Tensor | None = None  # fp32, on the CPU (features/quantized.py)
    k_block_scales: torch.Tensor | None = None
    v_block_scales: torch.Tensor | None = None

    def __post_init__(self):
        for f in REGISTRY:
            object.__setattr__(self, f.name, f.check(getattr(self, f.name)))
        _check_choice("alibi", self.alibi, ALIBI_MODES)
        _check_choice("bias_order", self.bias_order, BIAS_ORDERS)
        _check_choice("duplicates", self.duplicates, DUPLICATES)
        if self.duplicates == "twice" and self.indices is not None and self.indices.shape[1] > 1:
            raise InvalidArgument("indices", tuple(self.indices.shape), "lists per K/V head, counted with duplicates="
                                  "'twice': flashcheck weighs one list for every head", "Pass indices of shape "
                                  "(B, 1, Nq, topk), or declare duplicates='once'.")
        object.__setattr__(self, "quantization", scheme_named(self.quantization))
        zero = self.quantization.tensor_scales  # an all-zero tensor's one scale may be 0 (its codes are all 0)
        object.__setattr__(self, "descales", quantized.check_descales(self.descales, zero=zero))
        quantized.check_global_scales(self.descales, self.quantization)
        if self.descales is None and any(s is not None for s in self.block_scales):
            raise InvalidArgument("descales", None, "block scales without descales",
                                  "Pass the case's descales (1 where the scheme has none) with its block scales.")
        for name, b in zip(quantized.BLOCK_SCALES, self.quantization.blocks):
            if self.descales is not None:  # a quantized case: its scheme's block scales, each checked
                object.__setattr__(self, name, quantized.check_block_scales(name, getattr(self, name), b))

    @property
    def used(self) -> tuple[str, ...]:
        """The features this case uses, in registry order."""
        return tuple(f.name for f in REGISTRY if getattr(self, f.name) is not None)

    @property
    def restricts_keys(self) -> bool:
        return any(getattr(self, f.name) is not None for f in by_term("keys"))

    @property
    def keys_by_head(self) -> bool:
        """Whether the visible keys differ between batch entries or heads (a feature's mask reads them)."""
        return any(getattr(self, f.name) is not None and f.per_head for f in by_term("keys"))

    @property
    def biased(self) -> bool:
        return bool(self.biasing())

    def biasing(self) -> tuple:
        """The features that add a term to this case's logits: the bias features it uses, and a key restriction
        that weighs its keys (a key listed twice counted twice: its bias is the log of the count)."""
        return tuple(f for f in REGISTRY if f.bias is not None and getattr(self, f.name) is not None
                     and (f.term == "bias" or f.weighs(self)))

    @property
    def capped(self) -> bool:
        return self.cap is not None

    @property
    def quantized(self) -> bool:
        """Whether the case's inputs are quantized: their values are the codes times the variant's scales."""
        return self.descales is not None

    def dequantized(self, q, k, v):
        """The values the numerics work on: quantized inputs (B, H, N, D) times their scales, in float64 (exact:
        4 significand bits times 24), each query head with its K/V head's scale; others as they are."""
        if self.descales is None:
            return q, k, v
        return quantized.dequantize(q, k, v, self.descales, self.block_scales, self.quantization)

    def unquantized(self) -> "Variant":
        """The variant without its scales: for inputs that are not quantized."""
        return self.replace(descales=None, **dict.fromkeys(quantized.BLOCK_SCALES))

    @property
    def block_scales(self) -> tuple:
        """q's, k's and v's block scales (None where the scheme gives a tensor none)."""
        return tuple(getattr(self, name) for name in quantized.BLOCK_SCALES)

    def input_scales(self, b: int, kv_head: int) -> tuple[float, float, float]:
        """The scales of q, k and v at batch entry ``b`` and K/V head ``kv_head`` (1 where not quantized)."""
        if self.descales is None:
            return (1.0, 1.0, 1.0)
        return tuple(float(d) for d in self.descales[:, b, kv_head])

    def rescaled(self, multipliers) -> "Variant":
        """The variant with q's, k's and v's scales times ``multipliers`` (three numbers): a tensor's block scales
        where it has them, else its descale."""
        blocked = [m if s is not None else 1.0 for m, s in zip(multipliers, self.block_scales)]
        plain = [1.0 if s is not None else m for m, s in zip(multipliers, self.block_scales)]
        return self.replace(descales=self.descales * torch.tensor(plain).view(3, 1, 1),
                            **{n: s * m for n, s, m in zip(quantized.BLOCK_SCALES, self.block_scales, blocked)
                               if s is not None})

    # The terms, as the numerics see the variant (they name no feature; a new feature of a term needs none of
    # their code): the cap, the bias (:meth:`bias`), the visible keys (:meth:`visible`) and the sink.
    @property
    def cap(self) -> float | None:
        """The finite cap of the logits (None: none, or an infinite one)."""
        return finite_cap(self._term("cap"))

    @property
    def sink(self) -> torch.Tensor | None:
        """The sink logits, one per query head (Hq,) float32 (None: none)."""
        return self._term("sink")

    def _term(self, term: str):
        values = [getattr(self, f.name) for f in by_term(term) if getattr(self, f.name) is not None]
        return values[0] if values else None

    def kwargs(self, device=None) -> dict:
        """The keyword arguments a kernel receives (none for plain attention); tensors as fresh copies on
        ``device``, so a kernel writing into them cannot change the case."""
        out = {}
        for f in REGISTRY:
            value = getattr(self, f.name)
            if value is not None:
                out.update(f.keywords(value, device or "cpu") if f.keywords else {f.name: value})
        for name in TENSORS:
            if name in out:
                out[name] = out[name].to(device or "cpu", copy=True)
        if self.descales is not None:
            out.update(quantized.scale_kwargs(self.descales, self.block_scales, self.quantization, device or "cpu"))
        return out

    def bias(self, n_q: int, n_k: int, rows: torch.Tensor, device, *, size: bool = False):
        """The additive bias of ``rows`` in float64, every bias feature's summed, broadcastable to
        (B, Hq, R, Nk) (-inf where ``attn_bias`` hides a key), or None without one.

        ``size``: instead, the magnitude a legal kernel's bias arithmetic rounds on (each feature's own)."""
        out = None
        rows = rows.to(device)
        for f in self.biasing():
            term = f.bias(self, n_q, n_k, rows, device, size)
            out = term if out is None else out + term
        return out

    def visible(self, n_q: int, n_k: int, heads_q: int = 1):
        """The mask function (:mod:`~flashcheck.contract.masks` convention) of the keys the key-restricting
        features leave visible, or None when none restricts them (``heads_q``: the case's query heads)."""
        parts = [f.visible(getattr(self, f.name), n_q, n_k, heads_q) for f in by_term("keys")
                 if getattr(self, f.name) is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else masks.and_masks(*parts)

    def shown(self, n_q: int, n_k: int, heads_q: int = 1):
        """The mask function of the keys a feature shows whatever the rest of the case hides (trusted full blocks),
        or None."""
        parts = [f.shown(getattr(self, f.name), n_q, n_k, heads_q) for f in REGISTRY
                 if f.shown is not None and getattr(self, f.name) is not None]
        parts = [p for p in parts if p is not None]
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else masks.or_masks(*parts)

    def summed_keys(self, n_k: int) -> int:
        """The most terms a row's sums may hold: every key once, or more where a feature weighs its keys."""
        return max([n_k] + [f.summed(self, n_k) for f in self.biasing() if f.term == "keys"])

    def select(self, batch: slice | torch.Tensor = slice(None), heads: slice = slice(None), *,
               group: int = 1, queries: slice = slice(None)) -> "Variant":
        """The variant of the batch entries ``batch`` (a slice, or a tensor of their indices) and query heads
        ``heads`` of its case (each tensor feature cut where it has those dims; ``group``: query heads per K/V
        head, for a tensor of K/V heads), and of its queries ``queries`` (a feature with one entry per query)."""
        if self.descales is not None and heads != slice(None):
            raise InvalidArgument("heads", heads, "descales are per K/V head: a cut of query heads cannot keep them",
                                  "Select whole batch entries of an fp8 case.")
        cuts = {f.name: _cut(getattr(self, f.name), f.dims(getattr(self, f.name)), batch,
                             _kv_heads(heads, group) if f.kv_heads else heads)
                for f in REGISTRY if f.tensor}
        cuts.update({f.name: cuts[f.name][..., queries, :] for f in REGISTRY
                     if f.per_query and cuts.get(f.name) is not None})
        cuts.update({f.name: f.cut(getattr(self, f.name), batch, heads, group) for f in REGISTRY
                     if f.cut is not None and getattr(self, f.name) is not None})
        return self.replace(**cuts, descales=_cut(self.descales, (-2, None), batch, heads),
                            **{n: _cut(getattr(self, n), (0, None), batch, heads) for n in quantized.BLOCK_SCALES})

    def replace(self, **changes) -> "Variant":
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        parts = [f"{f.name}={f.text(getattr(self, f.name))}" for f in REGISTRY if getattr(self, f.name) is not None]
        if self.alibi_slopes is not None:
            parts.append(f"alibi={self.alibi}")
        if self.biased and self.capped:
            parts.append(f"bias_order={self.bias_order}")
        if self.descales is not None:
            parts.append(quantized.scales_text(self.descales, self.block_scales, self.quantization))
        return " ".join(parts)

    def equal_bits(self, other: "Variant") -> bool:
        if (self.used != other.used or self.alibi != other.alibi or self.bias_order != other.bias_order
                or self.duplicates != other.duplicates):
            return False
        if any(getattr(self, f.name) != getattr(other, f.name) for f in REGISTRY if not f.tensor):
            return False
        return all(_same_bits(getattr(self, t), getattr(other, t)) for t in TENSORS)

    def as_dict(self) -> dict:
        """The scalar parts as JSON values (the tensors are saved with the case's arrays)."""
        out = {}
        for f in REGISTRY:
            value = getattr(self, f.name)
            if not f.tensor and value is not None:
                out[f.name] = f.to_json(value)
        if self.alibi_slopes is not None:
            out["alibi"] = self.alibi
        if self.biased and self.softcap is not None:
            out["bias_order"] = self.bias_order
        if self.indices is not None and self.duplicates != "once":
            out["duplicates"] = self.duplicates
        if self.quantization.block_scaled:
            out["quantization"] = self.quantization.as_dict()
        return out

    @classmethod
    def from_dict(cls, data, tensors=None) -> "Variant":
        """The variant of :meth:`as_dict`'s ``data`` with its ``tensors`` (a dict of :data:`TENSORS`)."""
        data = {} if data is None else data
        keys = tuple(f.name for f in REGISTRY if not f.tensor) + SETTINGS + ("quantization",)
        if not isinstance(data, dict) or set(data) - set(keys):
            raise InvalidArgument("variant", data, f"expected a dict of {', '.join(keys[:-1])} and {keys[-1]}",
                                  "Pass e.g. {'window': [64, 0]}, {'chunk': 128} or {'softcap': 30.0}.")
        scalars = {f.name: f.from_json(data[f.name]) for f in REGISTRY if not f.tensor and data.get(f.name) is not None}
        tensors = {t: (tensors or {}).get(t) for t in TENSORS}
        return cls(**scalars, alibi=data.get("alibi", "symmetric"), bias_order=data.get("bias_order", "cap_first"),
                   duplicates=data.get("duplicates", "once"), quantization=data.get("quantization", "per_head"),
                   **tensors)


def settings_of(recipe_settings: dict) -> dict:
    """The Variant's settings (:data:`SETTINGS`: its ALiBi mode and bias order) a recipe's :data:`RECIPE_SETTINGS`
    record; those it does not, left to the Variant's defaults."""
    named = {"alibi_mode": "alibi", "bias_order": "bias_order", "duplicates": "duplicates"}  # recipe's -> Variant's
    return {named[k]: value for k, value in recipe_settings.items() if k in named and value is not None}


def _cut(t, dims, batch, heads: slice):
    """``t`` cut to ``batch`` and ``heads`` along its (batch, head) ``dims`` (None: it has none), where the dim
    exists and does not broadcast."""
    if t is None:
        return None
    index = [slice(None)] * t.dim()
    for dim, part in zip(dims, (batch, heads)):
        if dim is not None and t.dim() + dim >= 0 and t.shape[dim] > 1:
            index[dim] = part
    return t[tuple(index)]


def _kv_heads(heads: slice, group: int) -> slice:
    """The K/V heads of the query heads ``heads`` (a step-1 slice)."""
    if heads == slice(None):
        return heads
    return slice(heads.start // group, (heads.stop - 1) // group + 1)


def _same_bits(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise InvalidArgument(name, value, "unknown choice", f"Use one of {list(choices)}.")


def unsupported_variant(variant: Variant, spec, dtype) -> str | None:
    """Why ``spec`` cannot take ``variant`` (a feature it does not declare, or a value of one it declares that it
    refuses: another ALiBi mode, a bias dtype it does not accept; another bias order), or None."""
    missing = [f for f in variant.used if f not in declared(spec)]
    if missing:
        return f"uses {missing}, which the kernel's spec does not declare"
    for f in REGISTRY:
        why = f.refusal(variant, spec, dtype) if getattr(variant, f.name) is not None else None
        if why:
            return why
    if variant.biased and variant.capped and variant.bias_order != spec.bias_order:
        return f"uses bias_order={variant.bias_order!r}, the kernel's spec declares {spec.bias_order!r}"
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
    """An :class:`InvalidArgument` unless every tensor feature fits the case's shapes (each feature's own rule)
    and the descales give one per batch entry and K/V head."""
    for f in REGISTRY:
        value = getattr(variant, f.name)
        problem = f.shape_problem(value, shapes) if value is not None else None
        if problem:
            raise InvalidArgument(f.name, *problem)
    problem = quantized.shape_problem(variant.descales, variant.block_scales, variant.quantization, shapes)
    if problem:
        raise InvalidArgument(*problem)
