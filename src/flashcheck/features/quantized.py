"""A quantized case's scales: its descales, one per batch entry and K/V head for each of q, k and v (FA3's,
:mod:`flashcheck.inputs.quantization`), and its block scales, one per block of a tensor's values.

Values are ``code * block_scale * descale``. A scheme (:mod:`flashcheck.contract.quantization`) gives q, k and v each at most one :class:`Blocks`; the case
holds the scales as fp32 tensors (every value of an e8m0 or e4m3 scale is exact there), of the shapes
:class:`~flashcheck.contract.quantization.Blocks` gives, H the tensor's own heads. A kernel receives them as
``q_block_scales``, ``k_block_scales`` and ``v_block_scales`` in the scale format's torch dtype. A scale of 0
is legal: an all-zero block's. A scheme with a global scale (NVFP4's) holds it as the descales, equal over a tensor's
(B, Hkv), and passes it as ``q_global_scale``, ``k_global_scale``, ``v_global_scale`` (0-dim fp32); a scheme with
narrower codes (e2m1) has them carried in fp8_e4m3, each one of the code format's values. A scheme whose codes are
held in its compute format has them in a tensor's first ``span`` dims
(:meth:`~flashcheck.contract.quantization.Blocks.coded`); its other dims take a scale of 1. A scheme whose tensors have
one scale each and no block scales (FlashInfer's fp8 KV cache) passes it as ``k_scale`` and ``v_scale`` (0-dim fp32),
for the tensors it quantizes alone.
"""

from __future__ import annotations

import torch

from ..contract.formats import FORMATS, format_of
from ..contract.quantization import CODE_CARRIER, CODES, SCALE_FORMATS, Blocks, Scheme, scheme_named
from ..errors import InvalidArgument
from .tensors import as_float_tensor, head_values_text

__all__ = ["BLOCK_SCALES", "DESCALE_KWARGS", "GLOBAL_SCALES", "TENSOR_SCALES", "expanded", "dequantize", "check_descales",
           "check_block_scales", "check_global_scales", "check_codes", "check_held_codes", "stray_codes", "scale_names",
           "shape_of", "shape_problem", "exact", "scale_dtype", "scale_kwargs", "scales_text"]

BLOCK_SCALES = ("q_block_scales", "k_block_scales", "v_block_scales")
DESCALE_KWARGS = ("q_descale", "k_descale", "v_descale")
GLOBAL_SCALES = ("q_global_scale", "k_global_scale", "v_global_scale")
TENSOR_SCALES = ("q_scale", "k_scale", "v_scale")  # FlashInfer's and vLLM's names, for a tensor's only scale


def scale_names(scheme) -> tuple:
    """The kernel's keywords of q's, k's and v's second-level scales (the case's descales) under ``scheme``."""
    scheme = scheme_named(scheme)
    if scheme.global_scale:
        return TENSOR_SCALES if scheme.tensor_scales else GLOBAL_SCALES
    return DESCALE_KWARGS


def shape_of(blocks: Blocks, t_shape) -> tuple:
    """The shape of the block scales of a (B, H, N, D) tensor."""
    B, H, N, D = t_shape
    return {"tokens": (B, H, blocks.count(N)), "dims": (B, H, N, blocks.count(blocks.coded(D))),
            "columns": (B, H, blocks.count(N), D)}[blocks.axis]


def expanded(scales: torch.Tensor, blocks: Blocks, t_shape) -> torch.Tensor:
    """The block scales as one per value, broadcastable to a tensor of ``t_shape`` (B, H, N, D)."""
    N, D = t_shape[2], t_shape[3]
    if blocks.axis == "dims":
        coded = blocks.coded(D)
        return torch.nn.functional.pad(scales.repeat_interleave(blocks.size, 3)[..., :coded], (0, D - coded), value=1.0)
    rows = scales.repeat_interleave(blocks.size, 2)[:, :, :N]
    return rows[..., None] if blocks.axis == "tokens" else rows


def dequantize(q, k, v, descales, block_scales, scheme):
    """q, k and v (codes, (B, H, N, D)) times their block scales and descales, in float64 (exact: 4 significand
    bits times at most 24 times 24), each query head with its K/V head's descale."""
    out, scheme = [], scheme_named(scheme)
    for i, (t, blocks) in enumerate(zip((q, k, v), scheme.blocks)):
        if scheme.held_codes and "qkv"[i] in scheme.quantized:
            check_held_codes("qkv"[i], t, blocks, scheme.held_codes)
        t = t.to(torch.float64)
        if blocks is not None:
            t = t * expanded(block_scales[i].to(t.device, torch.float64), blocks, t.shape)
        d = descales[i].to(t.device, torch.float64)
        out.append(t * d.repeat_interleave(t.shape[1] // k.shape[1], 1)[:, :, None, None])
    return tuple(out)


def check_held_codes(name: str, t: torch.Tensor, blocks: Blocks | None, codes: str) -> None:
    """An :class:`InvalidArgument` unless the first dims of ``t`` that ``blocks`` scales (all, without blocks) hold
    values of the format ``codes`` (a scheme's :attr:`~flashcheck.contract.quantization.Scheme.held_codes`)."""
    x = t[..., :t.shape[-1] if blocks is None else blocks.coded(t.shape[-1])]
    if not torch.equal(x.to(FORMATS[codes].dtype).to(x.dtype), x):
        where = f"{codes} codes there ({blocks.text()})" if blocks is not None else f"{codes} codes, one scale per tensor"
        raise InvalidArgument(name, head_values_text(x.float()), f"holds values that are not {codes} codes in its "
                              f"first {x.shape[-1]} dims", f"Pass {name} with {where}.")


def scale_dtype(blocks: Blocks):
    return getattr(torch, SCALE_FORMATS[blocks.format])


def exact(scales: torch.Tensor, blocks: Blocks) -> bool:
    """Whether every one of ``scales`` (fp32) is a value of the scale format."""
    return torch.equal(scales.to(scale_dtype(blocks)).float(), scales.float())


def check_block_scales(name: str, value, blocks: Blocks | None):
    """``value`` as a CPU fp32 tensor: finite, not negative (0 is an all-zero block's), each exact in the scale
    format; None where the scheme gives the tensor no block scales (and the value is None)."""
    if value is None and blocks is None:
        return None
    fix = (f"Pass {name} as the scheme says: {blocks.text()}, finite and not negative." if blocks is not None else
           f"Pass no {name}: the case's quantization scheme gives this tensor none.")
    if value is None or blocks is None or not isinstance(value, torch.Tensor) or value.dim() not in (3, 4):
        raise InvalidArgument(name, None if value is None else _shape(value), "does not fit the scheme", fix)
    t = value.detach().to("cpu", torch.float32)
    if not bool((torch.isfinite(t) & (t >= 0)).all()):
        raise InvalidArgument(name, head_values_text(t), "holds a negative or non-finite scale", fix)
    if not exact(t, blocks):
        raise InvalidArgument(name, head_values_text(t), f"holds a value that is not exact in {blocks.format}", fix)
    return t.clone()


def _shape(value):
    return tuple(value.shape) if isinstance(value, torch.Tensor) else value


def shape_problem(descales, block_scales, scheme: Scheme, shapes) -> tuple | None:
    """(name, value, problem, fix) where a scale's shape does not fit the case's shapes, or None."""
    if descales is not None and tuple(descales.shape) != (3, shapes.batch, shapes.heads_kv):
        return ("descales", tuple(descales.shape), f"expected shape (3, {shapes.batch}, {shapes.heads_kv})",
                "Pass q's, k's and v's descales, one per batch entry and K/V head.")
    dims = {"q": (shapes.batch, shapes.heads_q, shapes.n_q, shapes.head_dim),
            "k": (shapes.batch, shapes.heads_kv, shapes.n_k, shapes.head_dim),
            "v": (shapes.batch, shapes.heads_kv, shapes.n_k, shapes.head_dim_v)}
    for name, s, blocks in zip(BLOCK_SCALES, block_scales, scheme_named(scheme).blocks):
        if s is not None and tuple(s.shape) != shape_of(blocks, dims[name[0]]):
            return (name, tuple(s.shape), f"expected {shape_of(blocks, dims[name[0]])} ({blocks.text()})",
                    "Pass one scale per block of the tensor's values.")
    return None


def scale_kwargs(descales, block_scales, scheme, device) -> dict:
    """The kernel's keywords: the descales where the scheme passes them, and each tensor's block scales in its
    scale format; fresh copies on ``device``."""
    scheme = scheme_named(scheme)
    out = dict(zip(DESCALE_KWARGS, descales.to(device, copy=True).unbind(0))) if scheme.descales else {}
    if scheme.global_scale:  # one per tensor: the descales hold it at every (batch entry, K/V head)
        out.update({name: d[0, 0].to(device, copy=True)
                    for name, d, t in zip(scale_names(scheme), descales.unbind(0), "qkv") if t in scheme.quantized})
    out.update({name: s.to(device, scale_dtype(blocks), copy=True)
                for name, s, blocks in zip(BLOCK_SCALES, block_scales, scheme.blocks) if s is not None})
    return out


def scales_text(descales, block_scales, scheme) -> str:
    """The scales in a case's one-line description."""
    scheme = scheme_named(scheme)
    parts = [] if scheme.name == "per_head" else [scheme.name]
    if scheme.tensor_scales:
        parts += [f"{n}={float(d[0, 0]):.6g}" for n, d, t in zip(TENSOR_SCALES, descales, "qkv") if t in scheme.quantized]
    elif scheme.global_scale:
        parts.append("global_scales=" + "/".join(f"{float(d[0, 0]):.6g}" for d in descales))
    else:
        parts.append(f"descales={head_values_text(descales)}")
    parts += [f"{name}={head_values_text(s)}" for name, s in zip(BLOCK_SCALES, block_scales) if s is not None]
    return ",".join(parts)


def check_descales(descales, *, zero: bool = False):
    """``descales`` as a CPU fp32 (3, B, Hkv) tensor, finite and positive, or 0 too where ``zero`` (a scale per
    tensor: an all-zero tensor's); None stays None."""
    if descales is None:
        return None
    least = "not negative" if zero else "positive"
    fix = f"Pass descales as a float32 tensor of shape (3, B, Hkv) (q's, k's and v's), finite and {least}."
    t = as_float_tensor("descales", descales, fix, (3,))
    if t.shape[0] != 3 or not bool((torch.isfinite(t) & ((t >= 0) if zero else (t > 0))).all()):
        raise InvalidArgument("descales", tuple(t.shape), f"expected (3, B, Hkv), finite and {least}", fix)
    return t.to("cpu", torch.float32).clone()


def check_global_scales(descales, scheme: Scheme) -> None:
    """Refuse descales that differ within a tensor where ``scheme`` has one global scale per tensor."""
    if scheme.global_scale and descales is not None and not bool((descales == descales[:, :1, :1]).all()):
        raise InvalidArgument("descales", head_values_text(descales), "differ within a tensor, whose scheme "
                              f"({scheme.name}) has one global scale per tensor",
                              "Pass each tensor's global scale at every batch entry and K/V head.")


def stray_codes(t: torch.Tensor, codes: str) -> torch.Tensor:
    """The values of ``t`` that are not values of the code format ``codes`` (:data:`CODES`; NaN is none), float32."""
    values = t.float()
    return values[~torch.isin(values.abs(), torch.tensor(CODES[codes], dtype=torch.float32, device=t.device))]


def check_codes(tensors: tuple, scheme: Scheme) -> None:
    """Refuse q, k or v that are not codes of ``scheme``'s narrower code format in fp8_e4m3, where it has one."""
    if scheme.codes is None:
        return
    carrier = format_of(CODE_CARRIER).dtype
    fix = f"Pass {scheme.codes} codes ({', '.join(f'{c:g}' for c in CODES[scheme.codes][1:])} and their negatives, " \
          f"or 0) as {carrier} tensors, which hold each exactly."
    for name, t in zip("qkv", tensors):
        if t.dtype != carrier:
            raise InvalidArgument(name, str(t.dtype), f"{scheme.name}'s {scheme.codes} codes come in {carrier}", fix)
        stray = stray_codes(t, scheme.codes)
        if stray.numel():
            raise InvalidArgument(name, head_values_text(stray), f"holds values that are not {scheme.codes} codes", fix)
