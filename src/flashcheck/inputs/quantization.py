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

Where the kernel's scheme (:mod:`flashcheck.contract.quantization`) gives a tensor block scales, its descales
are 1 and each block gets the quantizer's scale: its largest magnitude over fp8's largest value, rounded up in
the scale format (so no code saturates), 0 for an all-zero block (1 in e8m0, which has no zero). The block regime, also of the seed, shapes
the values first (:data:`BLOCK_REGIMES`): blocks of zeros, blocks at e8m0's or fp32's smallest scales, blocks
of one repeated value, one outlier per block over values that fall to fp8's subnormals, and scales one step
too small, so that a block's largest codes saturate at fp8's largest value.

NVFP4 (a scheme with a global scale and e2m1 codes) is drawn by its own quantizer (:mod:`flashcheck.numerics.nvfp4`):
a global scale per tensor, e4m3 block scales to nearest (a scale of 0 for an all-zero block), e2m1 codes saturating
at 6. Its ``tiny_scales`` blocks are 2^-16 of the rest, so that their scales fall to e4m3's subnormals (the global
scale sets the tensor's magnitude), and its ``saturating`` scales are those of 3/4 of the block's largest magnitude.

A scheme with one scale per tensor and no block scales (FlashInfer's ``k_scale``, ``v_scale``) shapes the tensor's
values with the block regimes over blocks of a head's tokens (``tiny_scales``: the whole tensor, half the time, so that
its scale nears fp32's smallest), and takes amax / fmax over the tensor, rounded up in fp32 (one step below 3/4 of it
where saturating; 0 for an all-zero tensor).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..contract.formats import format_of
from ..contract.quantization import Blocks, scheme_named
from ..contract.validation import Shapes
from ..features.quantized import BLOCK_SCALES, exact, expanded, scale_dtype, scale_names, shape_of, stray_codes
from ..features.variant import Variant
from ..numerics import nvfp4
from ..numerics.quantizers import pow2_scale, to_codes
from .case import AttentionCase
from .drawing import seeded

__all__ = ["DESCALE_REGIMES", "BLOCK_REGIMES", "INSIDE_REGIMES", "VALUE_FORMAT", "descale_regime", "block_regime",
           "inside_regime", "regime_text", "with_k_mean", "quantize", "shared_scales", "rescaled_case",
           "misread_scales"]

DESCALE_REGIMES = ("amax", "unit", "skewed")
# A kernel that quantizes inside: its inputs as drawn, or k with a large mean per channel (SageAttention smooths k by
# subtracting it in the input dtype before quantizing).
INSIDE_REGIMES = ("as_drawn", "k_mean")
K_MEAN_SPREADS = 16.0
BLOCK_REGIMES = ("amax", "zero_blocks", "tiny_scales", "identical", "outlier", "saturating")
# The regimes draw an fp8 case's values in fp16's range (activations an fp8 kernel is fed sit there);
# the descales carry their magnitude.
VALUE_FORMAT = "fp16"


def descale_regime(seed: int) -> str:
    """The descale regime of a recipe's seed (a function of the seed, so hypothesis replays it)."""
    return DESCALE_REGIMES[seed % len(DESCALE_REGIMES)]


def block_regime(seed: int) -> str:
    """The block regime of a recipe's seed (independent of its descale regime's choice)."""
    return BLOCK_REGIMES[(seed // len(DESCALE_REGIMES)) % len(BLOCK_REGIMES)]


def inside_regime(seed: int) -> str:
    """The regime of a case for a kernel that quantizes inside (:data:`INSIDE_REGIMES`), of the seed."""
    return INSIDE_REGIMES[(seed // 5) % len(INSIDE_REGIMES)]


def regime_text(seed: int, scheme="per_head") -> str:
    """The part of a recipe's regime (its provenance's strategy) that names the scale regimes, or for a kernel
    that quantizes inside its inputs' regime."""
    scheme = scheme_named(scheme)
    if scheme.quantizer:
        return f"/{scheme.name}={inside_regime(seed)}"
    if scheme.held_codes:  # no descales
        return f"/{scheme.name}={block_regime(seed)}"
    blocks = f",{scheme.name}={block_regime(seed)}" if scheme.block_scaled else ""
    return f"/descales={descale_regime(seed)}{blocks}"


def with_k_mean(k: torch.Tensor, seed: int) -> torch.Tensor:
    """``k`` in the ``k_mean`` regime: each channel of each (batch entry, head) shifted by up to K_MEAN_SPREADS
    times its largest magnitude (at least 1), within half the dtype's range, and rounded to k's dtype."""
    gen = seeded(seed + 11)
    B, H, _, D = k.shape
    direction = torch.randn((B, H, 1, D), generator=gen, device=gen.device).clamp(-3, 3).to(k.device)
    amax = k.float().abs().amax(dim=2, keepdim=True).clamp_min(1.0)
    room = (format_of(k.dtype).max_value / 2 - amax).clamp_min(0.0)
    shift = (direction * K_MEAN_SPREADS * amax).clamp(-room, room)
    return (k.float() + shift).to(k.dtype)


def _descales(t: torch.Tensor, shapes: Shapes, fmax: float, regime: str, gen) -> torch.Tensor:
    """(B, Hkv) fp32 descales of ``t`` (B, H, N, D), H a multiple of Hkv: its groups of heads share one."""
    amax = t.float().reshape(shapes.batch, shapes.heads_kv, -1).abs().amax(-1)
    base = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    if regime == "unit":
        return torch.ones_like(amax)
    if regime == "skewed":
        return (base * torch.exp2(6 * torch.rand(amax.shape, generator=gen))).float()
    return base.float()


def quantize(q, k, v, variant: Variant, *, shapes: Shapes, dtype: str, seed: int, scheme="per_head",
             source: list | None = None):
    """``(q8, k8, v8, variant)``: q, k, v in the fp8 format ``dtype`` and ``variant`` with their descales, in the
    regime of ``seed``, stacked as a (3, B, Hkv) fp32 tensor (q's, k's, v's), and with the block scales of
    ``scheme`` (1 as the descale of a tensor that has them), so that ``x8 * block_scale * descale`` are the
    case's values. A scheme whose codes are held in its compute format (``dtype``) gives tensors of that format:
    codes in the dims its blocks scale, the drawn values elsewhere and in a tensor without blocks. ``source``: a
    list that receives the full-precision values that were quantized (fp32)."""
    scheme = scheme_named(scheme)
    fmt = format_of(scheme.held_codes or dtype)
    held = format_of(scheme.compute_format(dtype)) if scheme.held_codes else None
    gen = seeded(int(seed) + 1)
    parts = [_quantized(t, blocks, scheme, shapes=shapes, fmt=fmt, held=held, seed=seed, gen=gen, plain=n not in
                        scheme.quantized) for t, blocks, n in zip((q, k, v), scheme.blocks, "qkv")]
    if source is not None:
        source.extend(p.source for p in parts)
    scaled = dict(zip(("q_block_scales", "k_block_scales", "v_block_scales"), (p.scales for p in parts)))
    return (*(p.codes for p in parts),
            variant.replace(descales=torch.stack([p.descale for p in parts]), quantization=scheme, **scaled))


@dataclass(frozen=True)
class _Quantized:
    """One tensor quantized: its codes (in their fp8 format, or held in the compute format), its (B, Hkv) descale
    (a global scale's value where the scheme has one), its block scales (None without) and the full-precision
    values they stand for (fp32)."""

    codes: torch.Tensor
    descale: torch.Tensor
    scales: torch.Tensor | None
    source: torch.Tensor


def _quantized(t, blocks: Blocks | None, scheme, *, shapes: Shapes, fmt, held, seed: int, gen,
               plain: bool) -> _Quantized:
    ones = torch.ones(shapes.batch, shapes.heads_kv)
    if plain:  # a tensor the scheme leaves unquantized: its values as drawn
        return _Quantized(t.to(held.dtype).contiguous(), ones, None, t.float())
    if scheme.tensor_scales:
        return _tensor_quantized(t.float(), shapes, fmt, held, block_regime(seed), gen)
    if blocks is None:
        d = _descales(t, shapes, fmt.max_value, descale_regime(seed), gen)
        per_value = d.repeat_interleave(t.shape[1] // shapes.heads_kv, 1).view(shapes.batch, t.shape[1], 1, 1)
        return _Quantized(_codes(t.float(), per_value, fmt, scheme.codes), d, None, t.float())
    coded = blocks.coded(t.shape[-1])
    values = _block_values(t[..., :coded].float(), blocks, block_regime(seed), gen, global_scale=scheme.global_scale)
    g = nvfp4.global_scale(values, blocks.format) if scheme.global_scale else None
    d = ones if g is None else torch.full((shapes.batch, shapes.heads_kv), float(g))
    scales = _block_scales(values, blocks, fmt.max_value, block_regime(seed), g)
    codes = _codes(values, expanded(scales, blocks, values.shape) * (1.0 if g is None else g), fmt, scheme.codes)
    if held is None:
        return _Quantized(codes, d, scales, values)
    rest = t[..., coded:].to(held.dtype)  # the dims past the span: unquantized
    return _Quantized(torch.cat((codes.to(held.dtype), rest), -1).contiguous(), d, scales,
                      torch.cat((values, rest.float()), -1))


def _tensor_quantized(t: torch.Tensor, shapes: Shapes, fmt, held, regime: str, gen) -> _Quantized:
    """``t`` with one fp32 scale for the whole tensor (see the module's docstring), its codes held in ``held``."""
    heads = Blocks(min(t.shape[2], 4096))  # a block: a head's tokens (Blocks hold at most 4,096 values)
    if regime == "tiny_scales" and bool(torch.rand((), generator=gen) < 0.5):
        values = t * 2.0**-100
    else:
        values = _block_values(t, heads, regime, gen, global_scale=False) if t.numel() else t
    fp32 = Blocks(1)
    amax = values.double().abs().max() if values.numel() else torch.tensor(0.0, dtype=torch.float64)
    scale = _rounded_up(amax / fmt.max_value, fp32)
    if regime == "saturating":
        scale = _rounded_up(scale * 0.75, fp32)
    scale = torch.where(amax > 0, scale, 0.0).float()
    codes = _codes(values, scale, fmt, None).to(held.dtype).contiguous()
    return _Quantized(codes, torch.full((shapes.batch, shapes.heads_kv), float(scale)), None, values)


def shared_scales(variant: Variant, head_dim_v: int) -> Variant:
    """``variant`` with V's scales K's, for V cut from K (MLA's one cached row): its descale, and its block scales
    where k's and v's blocks are alike (the first that scale V's ``head_dim_v`` dims)."""
    if not variant.quantized:
        return variant
    descales = torch.stack([variant.descales[0], variant.descales[1], variant.descales[1]])
    blocks = variant.quantization.v
    if blocks is None or blocks != variant.quantization.k:
        return variant.replace(descales=descales)
    k_scales = variant.k_block_scales
    if blocks.axis != "tokens":  # per dim, or per block of a token's dims: V's are K's first
        k_scales = k_scales[..., :blocks.count(blocks.coded(head_dim_v)) if blocks.axis == "dims" else head_dim_v]
    return variant.replace(descales=descales, v_block_scales=k_scales.contiguous())


def _codes(t: torch.Tensor, per_value: torch.Tensor, fmt, codes: str | None) -> torch.Tensor:
    """``t``'s codes in fmt's dtype under its per-value scales: fp32's quotient cast to fp8, or a narrower code
    format's nearest value of the float64 quotient (exact in fp8_e4m3)."""
    if codes is not None:
        return to_codes(t.double(), per_value.double(), codes).to(fmt.dtype)
    return torch.where(per_value > 0, t.float() / per_value, 0.0).clamp(-fmt.max_value, fmt.max_value).to(fmt.dtype)


def _blocks_view(t: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """``t`` (B, H, N, D) padded with zeros to whole blocks and viewed as (..., blocks, size): a token's dims in
    blocks along the dims, a dim's tokens otherwise ((B, H, D, nb, size))."""
    x = t if blocks.axis == "dims" else t.transpose(2, 3)
    pad = blocks.count(x.shape[-1]) * blocks.size - x.shape[-1]
    x = torch.nn.functional.pad(x, (0, pad))
    return x.reshape(*x.shape[:-1], -1, blocks.size)


def _from_blocks(x: torch.Tensor, blocks: Blocks, shape) -> torch.Tensor:
    x = x.reshape(*x.shape[:-2], -1)
    if blocks.axis == "dims":
        return x[..., :shape[3]]
    return x[..., :shape[2]].transpose(2, 3)


def _block_values(t: torch.Tensor, blocks: Blocks, regime: str, gen, *, global_scale: bool) -> torch.Tensor:
    """``t`` with the block regime's shape given to its values, block by block (a third of the blocks, drawn;
    a block of tokens with all its dims); ``global_scale``: a scheme's, beside which tiny blocks are 2^-16."""
    x = _blocks_view(t, blocks)
    shape = list(x.shape[:-1]) + [1]
    if blocks.axis == "tokens":
        shape[2] = 1
    chosen = torch.rand(shape, generator=gen, device=x.device) < 1 / 3
    if regime == "zero_blocks":
        x = torch.where(chosen, 0.0, x)
    elif regime == "tiny_scales":
        # scales near e8m0's and fp32's smallest, or in e4m3's subnormals under a global scale
        x = torch.where(chosen, x * 2.0 ** (-16 if global_scale else -100), x)
    elif regime == "identical":
        first = x[:, :, :1, :, :1] if blocks.axis == "tokens" else x[..., :1]
        x = torch.where(chosen, first.expand_as(x), x)
    elif regime == "outlier":  # one value per block (a block of tokens: its first token's first dim)
        spike = torch.zeros_like(x)
        spike[(slice(None),) * 2 + ((0,) if blocks.axis == "tokens" else (slice(None),)) + (Ellipsis, 0)] = 2.0**12
        x = torch.where(chosen, x * 2.0**-8 + spike, x)  # the rest 2^-20 of it and less: e4m3's subnormals
    return _from_blocks(x, blocks, t.shape)


def _block_scales(t: torch.Tensor, blocks: Blocks, fmax: float, regime: str, global_: torch.Tensor | None):
    """fp32 scales of ``t``'s blocks, exact in the scale format: amax / fmax rounded up there (0 for a block of
    zeros); the ``saturating`` regime's one step smaller, so that the block's largest codes saturate. Under a global
    scale ``global_``, NVFP4's: the nearest e4m3 of amax / 6 / global (of 3/4 of amax where saturating)."""
    amax = _blocks_view(t.double(), blocks).abs().amax(-1)
    if blocks.axis == "tokens":
        amax = amax.amax(2)  # (B, H, nb): one scale for all dims of a block of tokens
    if global_ is not None:
        scales = nvfp4.block_scales(amax * (0.75 if regime == "saturating" else 1.0), global_, blocks.format)
    elif blocks.format == "e8m0":  # no zero in e8m0: an all-zero block's scale is 1
        scales = pow2_scale(amax, fmax, rule="ceil") / torch.where((amax > 0) & (regime == "saturating"), 2.0, 1.0)
    else:
        scales = _rounded_up(amax / fmax, blocks)
        if regime == "saturating":
            scales = _rounded_up(scales * 0.75, blocks)
        scales = torch.where(amax > 0, scales, 0.0)
    scales = scales.float()
    return scales.transpose(2, 3).contiguous() if blocks.axis == "columns" else scales


def _rounded_up(x: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """``x`` (float64) rounded up to a value of the scale format (nearest, then one step up where it fell)."""
    near = x.to(scale_dtype(blocks)).double()
    bits = near.float().view(torch.int32) if blocks.format == "fp32" else None
    if bits is not None:  # fp32: the next float up is the next integer of the bits (positive values)
        up = (bits + 1).view(torch.float32).double()
    else:  # e4m3: the next code up
        up = (near.to(scale_dtype(blocks)).view(torch.uint8) + 1).view(scale_dtype(blocks)).double()
    return torch.where(near < x, up, near)


def _exact_factor(t: torch.Tensor, fmt, codes: str | None = None) -> float | None:
    """2 where doubling ``t`` stays in the range of its format ``fmt``, else 0.5 where halving keeps every value
    normal (or zero): exact either way; None where neither is (the largest value beside one near the smallest
    normal). Codes of a narrower format (``codes``): 2 or 0.5 where every product is one of its codes too."""
    if codes is not None:
        return next((f for f in (2.0, 0.5) if not stray_codes(t.float() * f, codes).numel()), None)
    magnitudes = t.float().abs()
    if float(magnitudes.max()) * 2 <= fmt.max_value:
        return 2.0
    if bool(((magnitudes == 0) | (magnitudes >= 2 * fmt.smallest_normal)).all()):
        return 0.5
    return None


def _coded(t: torch.Tensor, blocks: Blocks | None) -> int:
    """How many of ``t``'s dims hold codes (all, but past a span)."""
    return t.shape[-1] if blocks is None else blocks.coded(t.shape[-1])


def _times(t: torch.Tensor, factor: float, blocks: Blocks | None) -> torch.Tensor:
    """``t`` with its codes times ``factor`` (exact), the dims past a span as they are."""
    coded = _coded(t, blocks)
    scaled = (t[..., :coded].float() * factor).to(t.dtype)
    return scaled if coded == t.shape[-1] else torch.cat((scaled, t[..., coded:]), -1)


def rescaled_case(case: AttentionCase) -> tuple[str, AttentionCase] | None:
    """(what, case) with each of q, k and v times 2 and its scale halved (or halved and doubled), where
    that is exact: its block scales where it has them, else its descale; where neither q nor k can be, q's
    scale doubled and k's halved (their product alone scales the logits). Under a global scale per tensor, the
    power of two moves between each tensor's block scales and its global scale instead. The dequantized values'
    product, and so the exact output, is unchanged. A tensor whose scale the kernel does not receive stays as it is.
    None without descales."""
    variant = case.variant
    if not variant.quantized:
        return None
    if variant.quantization.global_scale and variant.quantization.block_scaled:
        return _moved_to_global(case)
    scheme, tensors = variant.quantization, (case.q, case.k, case.v)
    names = [f"{n}_block_scales" if s is not None else f"{n}_descale" for n, s in zip("qkv", variant.block_scales)]
    factors = [_exact_factor(t[..., :_coded(t, b)], format_of(scheme.held_codes or t.dtype), scheme.codes) or 1.0
               for t, b in zip(tensors, scheme.blocks)]
    factors = [f if _scales_take(variant, i, 1 / f) else 1.0 for i, f in enumerate(factors)]
    scaled = [_times(t, f, b) for t, f, b in zip(tensors, factors, scheme.blocks)]
    what = [f"{n} times {f:g} and {name} over {f:g}" for n, f, name in zip("qkv", factors, names) if f != 1.0]
    multipliers = [1 / f for f in factors]
    if factors[:2] == [1.0, 1.0] and _scales_take(variant, 0, 2.0) and _scales_take(variant, 1, 0.5):
        multipliers[:2] = [2.0, 0.5]
        what.insert(0, f"{names[0]} times 2 and {names[1]} over 2")
    if not what:
        return None
    return ", ".join(what), dataclasses.replace(case, q=scaled[0], k=scaled[1], v=scaled[2],
                                                variant=variant.rescaled(multipliers))


def _moved_to_global(case: AttentionCase) -> tuple[str, AttentionCase] | None:
    """(what, case) with each tensor's block scales times 2 and its global scale halved (or the reverse), where its
    block scales take it exactly (an fp32 global scale always does): each tensor's values are unchanged."""
    variant = case.variant
    moves = [next((f for f in (2.0, 0.5) if s is not None and _scales_take(variant, i, f)), 1.0)
             for i, s in enumerate(variant.block_scales)]
    what = [f"{n}_block_scales times {f:g} and {n}_global_scale over {f:g}" for n, f in zip("qkv", moves) if f != 1.0]
    if not what:
        return None
    scaled = {name: s * f for name, s, f in zip(BLOCK_SCALES, variant.block_scales, moves) if s is not None}
    descales = variant.descales / torch.tensor(moves).view(3, 1, 1)
    return ", ".join(what), dataclasses.replace(case, variant=variant.replace(descales=descales, **scaled))


def _scales_take(variant: Variant, i: int, factor: float) -> bool:
    """Whether tensor ``i``'s scale times ``factor`` stays exact and reaches the kernel: its block scales in their
    format, its descale where the scheme passes descales."""
    scales, blocks = variant.block_scales[i], variant.quantization.blocks[i]
    if factor == 1.0:
        return True
    if scales is None:  # its descale, or its one scale per tensor where the tensor holds codes
        scheme = variant.quantization
        return scheme.descales or (scheme.tensor_scales and "qkv"[i] in scheme.quantized)
    return exact(scales * factor, blocks)


def misread_scales(variant: Variant, b: int, kv_head: int) -> list[tuple[str, float]]:
    """(what, factor of the logits) for q's and k's descale at batch entry ``b`` and K/V head ``kv_head``
    ignored or applied twice, where it is not 1 (none without descales)."""
    if not variant.quantized:
        return []
    scales = variant.input_scales(b, kv_head)[:2]
    return [(f"{name} {how} (fp8)", factor) for name, d in zip(scale_names(variant.quantization), scales)
            for how, factor in (("ignored", 1 / d), ("applied twice", d)) if d not in (0.0, 1.0)]
