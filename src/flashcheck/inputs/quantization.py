"""fp8 inputs: values of a regime quantized to fp8 with per-(batch entry, K/V head) fp32 descales.

FA3's convention: ``q_descale``, ``k_descale`` and ``v_descale`` are (B, Hkv) fp32, the query heads of
one K/V head sharing its descale, and the kernel attends the dequantized values ``x8 * descale``. Those
are the case's exact inputs: an fp8 value times an fp32 descale is exact in float64, where the oracle
works. How a case's descales are chosen is its descale regime, a pure function of (seed, values):

- ``amax``: the quantizer's own, each (b, kv head)'s largest magnitude over fp8's largest value;
- ``unit``: 1 everywhere, the values clamped to fp8's range (a kernel that ignores a descale shows only
  under the ``descale`` property, which rescales K);
- ``skewed``: amax's times 2^u, u uniform in [0, 6) per (b, kv head): part of fp8's range only, so
  small values fall to its subnormals, and no two descales alike.
"""

from __future__ import annotations

import dataclasses

import torch

from ..contract.formats import format_of
from ..contract.validation import Shapes
from ..features.variant import DESCALE_KWARGS, Variant
from .case import AttentionCase
from .drawing import seeded

__all__ = ["DESCALE_REGIMES", "VALUE_FORMAT", "descale_regime", "regime_text", "quantize", "rescaled_case",
           "misread_scales"]

DESCALE_REGIMES = ("amax", "unit", "skewed")
# The regimes draw an fp8 case's values in fp16's range (activations an fp8 kernel is fed sit there);
# the descales carry their magnitude.
VALUE_FORMAT = "fp16"


def descale_regime(seed: int) -> str:
    """The descale regime of a recipe's seed (a function of the seed, so hypothesis replays it)."""
    return DESCALE_REGIMES[seed % len(DESCALE_REGIMES)]


def regime_text(seed: int) -> str:
    """The part of a recipe's regime (its provenance's strategy) that names the descale regime."""
    return f"/descales={descale_regime(seed)}"


def _descales(t: torch.Tensor, shapes: Shapes, fmax: float, regime: str, gen) -> torch.Tensor:
    """(B, Hkv) fp32 descales of ``t`` (B, H, N, D), H a multiple of Hkv: its groups of heads share one."""
    amax = t.float().reshape(shapes.batch, shapes.heads_kv, -1).abs().amax(-1)
    base = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    if regime == "unit":
        return torch.ones_like(amax)
    if regime == "skewed":
        return (base * torch.exp2(6 * torch.rand(amax.shape, generator=gen))).float()
    return base.float()


def quantize(q, k, v, variant: Variant, *, shapes: Shapes, dtype: str, seed: int):
    """``(q8, k8, v8, variant)``: q, k, v in the fp8 format ``dtype`` and ``variant`` with their descales, in the
    regime of ``seed``, stacked as a (3, B, Hkv) fp32 tensor (q's, k's, v's), so that ``x8 * descale`` are the
    case's values."""
    fmt = format_of(dtype)
    gen = seeded(int(seed) + 1)
    descales, out = [], []
    for t in (q, k, v):
        d = _descales(t, shapes, fmt.max_value, descale_regime(seed), gen)
        per_head = d.repeat_interleave(t.shape[1] // shapes.heads_kv, 1).view(shapes.batch, t.shape[1], 1, 1)
        out.append((t.float() / per_head).clamp(-fmt.max_value, fmt.max_value).to(fmt.dtype).contiguous())
        descales.append(d)
    return (*out, variant.replace(descales=torch.stack(descales)))


def _exact_factor(t: torch.Tensor) -> float | None:
    """2 where doubling ``t`` stays in its fp8 range, else 0.5 where halving keeps every value normal (or
    zero): exact either way; None where neither is (fp8's largest value beside one near its smallest normal)."""
    fmt, magnitudes = format_of(t), t.float().abs()
    if float(magnitudes.max()) * 2 <= fmt.max_value:
        return 2.0
    if bool(((magnitudes == 0) | (magnitudes >= 2 * fmt.smallest_normal)).all()):
        return 0.5
    return None


def rescaled_case(case: AttentionCase) -> tuple[str, AttentionCase] | None:
    """(what, case) with each of q, k and v times 2 and its descale halved (or halved and doubled), where
    that is exact; where neither q nor k can be, q's descale doubled and k's halved (their product alone
    scales the logits). The dequantized values' product, and so the exact output, is unchanged. None
    without descales."""
    if not case.variant.quantized:
        return None
    factors = [_exact_factor(t) or 1.0 for t in (case.q, case.k, case.v)]
    scaled = [(t.float() * f).to(t.dtype) for t, f in zip((case.q, case.k, case.v), factors)]
    what = [f"{n} times {f:g} and {n}_descale over {f:g}" for n, f in zip("qkv", factors) if f != 1.0]
    multipliers = [1 / f for f in factors]
    if factors[:2] == [1.0, 1.0]:
        multipliers[:2] = [2.0, 0.5]
        what.insert(0, "q_descale times 2 and k_descale over 2")
    return ", ".join(what), dataclasses.replace(case, q=scaled[0], k=scaled[1], v=scaled[2],
                                                variant=case.variant.rescaled(multipliers))


def misread_scales(variant: Variant, b: int, kv_head: int) -> list[tuple[str, float]]:
    """(what, factor of the logits) for q's and k's descale at batch entry ``b`` and K/V head ``kv_head``
    ignored or applied twice, where it is not 1 (none without descales)."""
    if not variant.quantized:
        return []
    scales = variant.input_scales(b, kv_head)[:2]
    return [(f"{name} {how} (fp8)", factor) for name, d in zip(DESCALE_KWARGS, scales)
            for how, factor in (("ignored", 1 / d), ("applied twice", d)) if d != 1.0]
