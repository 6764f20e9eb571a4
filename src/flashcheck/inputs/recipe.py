"""The recipe of a generated case: everything that rebuilds it exactly, in a few words and a seed.

A :class:`Recipe` names a shape, a dtype, a value regime, a mask regime, a causal alignment, a scale regime,
a memory layout, the variant regimes, the serving form and a seed; :meth:`Recipe.build` turns it into an
:class:`~flashcheck.inputs.case.AttentionCase` (or a :class:`~flashcheck.inputs.serving.ServingCase`).
Saved cases hold it as :meth:`Recipe.as_dict`. Hypothesis draws recipes
(:mod:`flashcheck.inputs.recipe_draws`) and shrinks them, never a tensor element by element.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..contract.formats import FP8_DTYPES
from ..contract.validation import Shapes
from ..features.variant import FEATURES
from .case import AttentionCase
from .drawing import drawing_on
from .packing import serving_case
from .quantization import VALUE_FORMAT, descale_regime, quantize
from .regimes import make_mask, make_scale, make_values
from .serving import ServingCase
from .variant_regimes import make_variant

__all__ = ["BIAS_FIELDS", "FORM_FIELDS", "POOL_FIELDS", "Recipe"]

# The fields by concern. Drawn from a pool, in the order they are drawn: first, so that a covering plan
# (flashcheck.inputs.covering) can pin them by the first choices of a case. The variant features come
# last: a kernel that declares none draws them from pools of one ("none"), which take no choice.
POOL_FIELDS = ("dtype", "values", "mask", "causal", "scale", "layout") + FEATURES + ("packing", "pages", "poison",
                                                                                     "seqused")
BIAS_FIELDS = ("alibi_mode", "bias_order", "bias_dtype")  # filled from the spec, after the pooled fields
FORM_FIELDS = ("packing", "pages", "poison", "form", "same_lengths", "seqused")


@dataclass(frozen=True)
class Recipe:
    """Everything needed to rebuild one generated case exactly."""

    # The dense case: its shapes, dtype and regimes (flashcheck.inputs.regimes), the seed of its numbers.
    shapes: Shapes
    dtype: str
    values: str = "random"
    mask: str = "none"
    causal: str = "none"
    scale: str = "default"
    layout: str = "contiguous"
    seed: int = 0
    # The variant regimes (flashcheck.inputs.variant_regimes), "none" for a feature not used.
    softcap: str = "none"
    alibi_slopes: str = "none"
    attn_bias: str = "none"
    window: str = "none"
    chunk: str = "none"
    sinks: str = "none"
    # What the kernel's spec asks of a biased case (None where the recipe has no such part): the ALiBi
    # mode, the order of cap and bias, the bias's dtype (the inputs' or fp32, with spec fp32_bias=True).
    alibi_mode: str | None = None
    bias_order: str | None = None
    bias_dtype: str | None = None
    # The serving form (flashcheck.contract.forms) and its physical regimes (flashcheck.inputs.packing),
    # "none" for the dense form.
    packing: str = "none"
    pages: str = "none"
    poison: str = "none"
    form: str = "dense"
    same_lengths: bool = False  # each sequence's queries are its keys (a spec with equal_lengths)
    seqused: str = "none"  # a varlen kernel's seqused_k (flashcheck.inputs.packing.SEQUSED_REGIMES)
    elements: str = "none"  # "past_int32": the batch grown past INT32_ELEMENTS (ELEMENT_REGIMES)

    @property
    def variants(self) -> dict[str, str]:
        """The variant features this recipe uses, with their regimes."""
        return {f: getattr(self, f) for f in FEATURES if getattr(self, f) != "none"}

    @property
    def regime(self) -> str:
        used = "".join(f"/{f}={name}" for f, name in self.variants.items())
        form = "" if self.form == "dense" else f"/{self.form}={self.packing}" + (
            f",pages={self.pages}" if self.form == "paged" else "") + (
            f",seqused_k={self.seqused}" if self.seqused != "none" else "")
        fp8 = f"/descales={descale_regime(self.seed)}" if self.dtype in FP8_DTYPES else ""
        large = "" if self.elements == "none" else f"/elements={self.elements}"
        return f"{self.values}/{self.mask}{used}{form}{fp8}{large}"

    def build(self, *, kernel: str | None = None, draw_on=None) -> AttentionCase | ServingCase:
        """The case, kept on the CPU; ``draw_on`` (a device, default the CPU) draws its dense tensors there
        (:mod:`flashcheck.inputs.drawing`: the same recipe, other numbers than the CPU's)."""
        with drawing_on(draw_on):
            case = self._dense(kernel)
        if self.form == "dense":
            return case
        return serving_case(case, form=self.form, packing=self.packing, pages=self.pages, poison=self.poison,
                            seed=self.seed, same_lengths=self.same_lengths, seqused=self.seqused)

    def _dense(self, kernel: str | None) -> AttentionCase:
        s = self.shapes
        fp8 = self.dtype in FP8_DTYPES
        q, k, v = make_values(self.values, shapes=s, dtype=VALUE_FORMAT if fp8 else self.dtype, seed=self.seed)
        descales = None
        if fp8:
            q, k, v, descales = quantize(q, k, v, shapes=s, dtype=self.dtype, regime=descale_regime(self.seed),
                                         seed=self.seed)
        if self.layout == "expanded":
            # Stride-0 heads can only hold equal heads: keep head 0 of k and v everywhere.
            k, v = (t[:, :1].expand_as(t).contiguous() for t in (k, v))
        variant = make_variant(self.variants, shapes=s, seed=self.seed, bias_dtype=self.bias_dtype or self.dtype,
                               alibi=self.alibi_mode or "symmetric", bias_order=self.bias_order or "cap_first")
        return AttentionCase.create(
            q, k, v, scale=make_scale(self.scale, head_dim=s.head_dim), causal=self.causal,
            attn_mask=make_mask(self.mask, shapes=s, seed=self.seed), layout=self.layout,
            provenance={"seed": self.seed, "strategy": self.regime, "kernel": kernel,
                        "recipe": self.as_dict()},
            variant=variant.replace(descales=descales))

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["shapes"] = dataclasses.asdict(self.shapes)
        for name in FEATURES + BIAS_FIELDS + FORM_FIELDS + ("elements",):  # a plain recipe is saved as before
            if out[name] in ("none", None, "dense", False):
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Recipe":
        data = dict(data)
        data["shapes"] = Shapes(**data["shapes"])
        return cls(**data)
