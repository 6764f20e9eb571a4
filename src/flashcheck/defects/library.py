"""The library of defect models: each a known numerical mistake of attention kernels, committed by the
precision-faithful twin (:class:`~flashcheck.numerics.twin.Defect` for the forward,
:class:`~flashcheck.defects.gradients.GradientDefect` for the backward) and parametrised where the mistake comes in
several forms (which narrow format, which tile). :mod:`flashcheck.defects.matching` runs them against a bug.

A model is a record: its name, what it says a kernel does (with ``{}`` for the parameter), the parameters tried,
how it builds the twin's defect from one, and the planted bugs it is known to name (the tests check that it does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

from ..contract.formats import FORMATS as FLOATS
from ..contract.formats import QUANTIZED_DTYPES
from ..numerics.twin import LOG2E, Defect
from .gradients import GradientDefect

__all__ = ["BACKWARD_MODELS", "FORMATS", "FORWARD_MODELS", "MODELS", "DefectModel", "ModelCase", "model_named",
           "key_tiles", "rounding"]

# The narrow formats a defect rounds to, (torch dtype, significand bits): the half formats and, for P, the first
# quantized format (kernels that requantize P use it). "bf16 truncated" drops an fp32's low 16 bits, as a
# conversion by bit masking does (the Triton interpreter's, too).
_NARROW = QUANTIZED_DTYPES[0]
FORMATS = {name: (FLOATS[name].dtype, FLOATS[name].significand_bits) for name in ("fp16", "bf16", _NARROW)}
FORMATS["bf16 truncated"] = FORMATS["bf16"]
_BITS = {"fp32": 24, "tf32": 11, "fp16": 11, "bf16": 8}  # of the contract's P formats
TILES = (16, 32, 64, 128)
HALVES = ("fp16", "bf16", "bf16 truncated")
P_FORMATS = ("fp16", "bf16", "bf16 truncated", _NARROW)


def rounding(fmt: str) -> Callable:
    """fp32 values rounded to ``fmt`` and back (a quantized format saturates at its largest finite value, as
    kernels clamp before the cast)."""
    dtype = FORMATS[fmt][0]
    if fmt == "bf16 truncated":
        return lambda x: (x.float().contiguous().view(torch.int32) & ~0xFFFF).view(torch.float32)
    if fmt in FLOATS and FLOATS[fmt].quantized:
        top = FLOATS[fmt].max_value
        return lambda x: x.clamp(-top, top).to(dtype).float()
    return lambda x: x.to(dtype).float()


@dataclass(frozen=True)
class ModelCase:
    """What a model's applicability and parameters depend on: the case's input dtype, the format the contract
    rounds P to, its scale and sizes."""

    dtype: str
    p_format: str  # "fp32", "tf32", "fp16" or "bf16"
    scale: float
    head_dim: int
    n_k: int
    backward: bool = False
    grouped: bool = False  # several query heads share a K/V head


@dataclass(frozen=True)
class DefectModel:
    """One known mistake. ``says`` reads "the kernel ..." with ``{}`` for the parameter; ``build`` makes the twin's
    :class:`Defect` (or a :class:`GradientDefect` for a backward model) from one of ``params``; ``applies`` says
    whether a parameter is a mistake at all on a case (rounding fp16 inputs' products to fp32 is none)."""

    name: str
    says: str
    params: tuple
    build: Callable
    applies: Callable = lambda param, case: True
    backward: bool = False
    planted: tuple[str, ...] = ()  # KERNEL~BUG names whose best fit this model is

    def describe(self, param) -> str:
        if param is None:
            return self.says
        return self.says.format(*param) if isinstance(param, tuple) else self.says.format(param)


def _narrower(fmt: str, than: str) -> bool:
    return FORMATS[fmt][1] < _BITS[than]


def _half_of_inputs(fmt: str, case: ModelCase) -> bool:
    """A half format of the inputs (fp16 products of fp16 inputs), or any half format under fp32 inputs."""
    return fmt.split()[0] == case.dtype or case.dtype == "fp32"


def _products_in(fmt: str, *, partial_sums: str | None = None) -> Callable:
    """Q @ K^T formed one product at a time in ``fmt`` and summed in fp32 (``partial_sums``: every partial sum
    rounded to ``fmt`` too, "pairwise" or "in order"), in row chunks that keep the (rows, keys, D) products
    small."""
    to = rounding(fmt)

    def dot(a, b):  # a (B, Hq, R, D), b (B or 1, Hkv, D, C)
        batch, heads_q, rows, d = a.shape
        heads_kv = b.shape[1]
        grouped = a.reshape(batch, heads_kv, heads_q // heads_kv * rows, d)
        keys = b.transpose(-1, -2)[:, :, None]  # (B, Hkv, 1, C, D)
        chunk = max(1, (1 << 22) // max(1, batch * heads_q * b.shape[-1] * d))
        parts = []
        for r0 in range(0, grouped.shape[2], chunk):
            products = grouped[:, :, r0:r0 + chunk, None, :] * keys
            if partial_sums in _FUSED_SUMS:
                parts.append(_FUSED_SUMS[partial_sums](products, to))
                continue
            terms = to(products)
            parts.append(terms.sum(-1) if partial_sums is None else _SUMS[partial_sums](terms, to))
        out = torch.cat(parts, 2)
        return out.view(out.shape[0], heads_q, rows, -1)

    return dot


def _pairwise(x, to):
    """The last dim summed as a tree, each partial sum rounded by ``to``."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.nn.functional.pad(x, (0, 1))
        half = x.shape[-1] // 2
        x = to(x[..., :half] + x[..., half:])
    return x[..., 0]


def _in_order(x, to):
    """The last dim summed one term after the other, each partial sum rounded by ``to``."""
    total = x[..., 0]
    for i in range(1, x.shape[-1]):
        total = to(total + x[..., i])
    return total


def _runs_then_pairwise(run: int) -> Callable:
    """Triton's compiled reduction: each thread sums its ``run`` contiguous terms in order, then the threads'
    sums meet in a butterfly of halving strides (:func:`_pairwise`); the run is the layout's values per thread,
    which the kernel's tile and warps pick (an autotuned kernel's may change from call to call)."""

    def total(x, to):
        x = torch.nn.functional.pad(x, (0, -x.shape[-1] % run)).unflatten(-1, (-1, run))
        return _pairwise(_in_order(x, to), to)

    return total


def _odd_fp32(x: torch.Tensor) -> torch.Tensor:
    """float64 values rounded to fp32 toward zero with the last bit set where that was inexact (round to odd):
    rounding that on to a half format rounds the float64 value once, as one fused multiply-add does."""
    r = x.float()
    r = torch.where(r.double().abs() > x.abs(), torch.nextafter(r, torch.zeros_like(r)), r)
    return (r.view(torch.int32) | (r.double() != x).int()).view(torch.float32)


def _fused_runs_then_pairwise(run: int) -> Callable:
    """Triton 3.6's compiled half-precision sum of products with FP fusion on (sm_90 PTX): in each thread's run of
    ``run`` products the second is rounded alone, the first joins it in one multiply-add, and each next one joins
    the running sum in a multiply-add of its own (a single rounding each); the runs meet in a halving butterfly.
    It takes the exact products, not rounded ones."""

    def total(x, to):
        x = torch.nn.functional.pad(x, (0, -x.shape[-1] % run)).unflatten(-1, (-1, run)).double()
        acc = to(x[..., 1])
        for i in (0, *range(2, run)):
            acc = to(_odd_fp32(acc.double() + x[..., i]))
        return _pairwise(acc, to)

    return total


_SUMS = {"pairwise": _pairwise, "in order": _in_order,
         **{f"runs of {run} in order, then pairwise": _runs_then_pairwise(run) for run in (2, 4, 8)}}
# Orders that take the exact products (a multiply-add rounds a product and a sum once).
_FUSED_SUMS = {f"runs of {run} as multiply-adds from the second product, then pairwise": _fused_runs_then_pairwise(run)
               for run in (4, 8)}
_HALF_SUMS = tuple((f, order) for f in ("fp16", "bf16", "bf16 truncated") for order in (*_SUMS, *_FUSED_SUMS))


# How a scale goes wrong, as the factor it multiplies the scale by (given the case).
_SCALE_SLIPS = {
    "applied twice": lambda c: c.scale,
    "ignored (taken as 1)": lambda c: 1.0 / c.scale if c.scale else 1.0,
    "taken as 1/sqrt(D)": lambda c: 1.0 / (math.sqrt(c.head_dim) * c.scale) if c.scale else 1.0,
    "without log2(e) in an exp2 kernel": lambda c: math.log(2.0),
    "with log2(e) in an exp kernel": lambda c: LOG2E,
}


def _logits_rounded(fmt: str, case: ModelCase) -> Defect:
    """Scores rounded to ``fmt``, times the base-2 scale rounded to ``fmt``, the product rounded again."""
    scale2 = case.scale * LOG2E
    rounded = float(torch.tensor(scale2).to(FORMATS[fmt][0]))
    return Defect(scores=rounding(fmt), logits=rounding(fmt), logit_factor=rounded / scale2 if scale2 else 1.0)


def _triton(*bugs: str) -> tuple[str, ...]:
    """The planted bugs of flashcheck's Triton kernel that commit a model's mistake (kernels/triton/planted*.py)."""
    return tuple(f"flashcheck:triton~{bug}" for bug in bugs)


FORWARD_MODELS: tuple[DefectModel, ...] = (
    DefectModel("products_in", "forms each q.k product in {} before an fp32 sum", HALVES,
                lambda f, c: Defect(dot=_products_in(f)), _half_of_inputs,
                planted=_triton("qk_products_in_input_dtype")),
    DefectModel("sums_in", "sums each q.k dot product in {0}, rounding at every step ({1})",
                _HALF_SUMS, lambda p, c: Defect(dot=_products_in(p[0], partial_sums=p[1])),
                lambda p, c: _half_of_inputs(p[0], c), planted=_triton("qk_sum_in_input_dtype")),
    DefectModel("prescaled_sums_in", "multiplies Q by the scale in {0} and sums each q.k dot product in {0}, "
                "rounding at every step ({1})", _HALF_SUMS,
                lambda p, c: Defect(prescale=rounding(p[0]), dot=_products_in(p[0], partial_sums=p[1])),
                lambda p, c: p[0].split()[0] == c.dtype, planted=_triton("q_prescaled_sum_in_input_dtype")),
    DefectModel("scores_rounded", "rounds the scores Q K^T to {} before the softmax", HALVES,
                lambda f, c: Defect(scores=rounding(f)), _half_of_inputs,
                planted=_triton("scores_rounded_then_promoted")),
    DefectModel("logits_rounded", "rounds the scores Q K^T to {0} and multiplies them by the scale (times log2(e)) "
                "in {0}: the scale and the product rounded to {0} too", HALVES, _logits_rounded,
                _half_of_inputs,
                planted=_triton("scores_rounded_to_input_dtype")),
    DefectModel("q_prescaled", "multiplies Q by the scale in {} (rounded) before Q K^T", HALVES,
                lambda f, c: Defect(prescale=rounding(f)), lambda f, c: f.split()[0] == c.dtype,
                planted=_triton("q_prescaled_in_input_dtype")),
    DefectModel("p_rounded", "rounds P to {} before P @ V, narrower than its contract allows",
                P_FORMATS,
                lambda f, c: Defect(p=rounding(f)), lambda f, c: _narrower(f, c.p_format),
                planted=_triton("p_rounded_to_bf16")),
    DefectModel("scale_slip", "applies the softmax scale {}", tuple(_SCALE_SLIPS),
                lambda s, c: Defect(logit_factor=_SCALE_SLIPS[s](c)),
                lambda s, c: abs(_SCALE_SLIPS[s](c) - 1.0) > 1e-6,
                planted=_triton("scale_ignored", "log2e_forgotten")),
    DefectModel("exp_of_base2_logits", "takes exp, not exp2, of its base-2 logits for P (the rescale in base 2)",
                (None,), lambda _, c: Defect(exp_p=torch.exp), planted=_triton("exp_instead_of_exp2")),
    DefectModel("max_not_carried", "takes each key tile's own max as the running max", (None,),
                lambda _, c: Defect(carry_max=False), planted=_triton("max_not_carried")),
    DefectModel("acc_not_rescaled", "does not rescale the accumulator when the running max grows", (None,),
                lambda _, c: Defect(rescale_acc=False), planted=_triton("acc_rescale_forgotten")),
    DefectModel("sum_not_rescaled", "does not rescale the row sum l when the running max grows", (None,),
                lambda _, c: Defect(rescale_sum=False), planted=_triton("sum_rescale_forgotten")),
    DefectModel("acc_rounded", "accumulates P @ V in {} (rounded after each key tile)", HALVES,
                lambda f, c: Defect(acc=rounding(f)), planted=_triton("acc_rounded_to_fp16")),
    DefectModel("sum_rounded", "sums the softmax's l in {} (rounded after each key tile)", HALVES,
                lambda f, c: Defect(row_sum=rounding(f)), planted=_triton("row_sum_rounded_to_fp16")),
    DefectModel("finite_sentinel", "hides a key with a finite logit offset of -{:g} instead of -inf",
                (65504.0, 1e30), lambda x, c: Defect(masked_logit=-x),
                planted=_triton("bias_finite_sentinel", "finite_mask_sentinel")),
    DefectModel("lse_base2", "returns lse in base 2 where it declares base e", (None,),
                lambda _, c: Defect(lse=lambda lse, m: lse * LOG2E), planted=_triton("lse_log2_units")),
    DefectModel("lse_without_max", "returns log(l) without the row max in lse", (None,),
                lambda _, c: Defect(lse=lambda lse, m: lse - m / LOG2E),
                planted=_triton("lse_missing_max")),
)

# The backward's mistakes (flashcheck.defects.gradients computes dQ, dK and dV with one of them).
BACKWARD_MODELS: tuple[DefectModel, ...] = (
    DefectModel("ds_rounded", "rounds dS to {} before dQ = dS K and dK = dS^T Q", HALVES,
                lambda f, c: GradientDefect(ds=rounding(f)), lambda f, c: f != c.dtype or c.dtype == "fp16",
                backward=True, planted=_triton("ds_rounded_to_bf16", "ds_rounded_to_fp16")),
    DefectModel("scaled_ds_rounded", "rounds scale x dS to {} (the scale applied before the rounding)", HALVES,
                lambda f, c: GradientDefect(scaled_ds=rounding(f)), _half_of_inputs, backward=True,
                planted=_triton("scaled_ds_rounded_to_input_dtype")),
    DefectModel("p_rounded_for_ds", "computes dS from P rounded to {}", HALVES,
                lambda f, c: GradientDefect(p_for_ds=rounding(f)), _half_of_inputs, backward=True,
                planted=_triton("p_rounded_for_ds")),
    DefectModel("p_rounded_for_dv", "rounds P to {} before dV = P^T dO, narrower than its contract allows",
                P_FORMATS, lambda f, c: GradientDefect(p_for_dv=rounding(f)),
                lambda f, c: _narrower(f, c.p_format), backward=True,
                planted=_triton("p_rounded_to_bf16_in_dv")),
    DefectModel("dv_accumulated", "accumulates dV in {} (rounded after each tile of {} query rows)",
                tuple((f, n) for f in HALVES for n in TILES),
                lambda p, c: GradientDefect(dv_acc=rounding(p[0]), block_m=p[1]),
                backward=True, planted=_triton("dv_accumulated_in_fp16")),
    DefectModel("group_share_rounded", "rounds each query head's dK and dV share to {} before the group's sum",
                HALVES, lambda f, c: GradientDefect(share=rounding(f)),
                lambda f, c: c.grouped and _half_of_inputs(f, c), backward=True,
                planted=_triton("group_shares_rounded")),
    DefectModel("group_sum_rounded", "sums the query heads' dK and dV shares in {} (the running sum rounded after "
                "each head)", HALVES, lambda f, c: GradientDefect(share=rounding(f), running=True),
                lambda f, c: c.grouped and _half_of_inputs(f, c), backward=True,
                planted=_triton("group_sum_in_input_dtype")),
)

MODELS = FORWARD_MODELS + BACKWARD_MODELS


def model_named(name: str) -> DefectModel:
    return next(m for m in MODELS if m.name == name)


def key_tiles(n_k: int) -> tuple[int, ...]:
    """The key tiles a forward model runs with: each of :data:`TILES` that splits the keys, and one that holds
    them all (every larger tile computes the same)."""
    return tuple(t for t in TILES if t < n_k) + (next((t for t in TILES if t >= n_k), TILES[-1]),)

