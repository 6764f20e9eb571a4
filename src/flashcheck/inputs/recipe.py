"""The recipe of a generated case: everything that rebuilds it exactly, in a few words and a seed.

A :class:`Recipe` names a shape, a dtype, a value regime, a mask regime, a causal alignment, a scale regime,
a memory layout, the variant regimes, the serving form and a seed; :meth:`Recipe.build` turns it into an
:class:`~flashcheck.inputs.case.AttentionCase` (or a :class:`~flashcheck.inputs.serving.ServingCase`).
Saved cases hold it as :meth:`Recipe.as_dict`. Hypothesis draws recipes
(:mod:`flashcheck.inputs.recipe_draws`) and shrinks them, never a tensor element by element.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..contract.formats import is_quantized
from ..contract.quantization import scheme_named
from ..contract.validation import Shapes
from ..errors import InvalidArgument
from ..features import forms
from ..features.forms import form_values
from ..features.registry import REGISTRY
from ..features.variant import FEATURES, RECIPE_SETTINGS, Variant, settings_of
from .case import AttentionCase
from .drawing import drawing_on, drawn_on
from .packing import serving_case
from .quantization import VALUE_FORMAT, inside_regime, quantize, regime_text, shared_scales, with_k_mean
from .regimes import make_mask, make_scale, make_values
from .serving import ServingCase
from .variant_regimes import fit_to_values, make_variant

__all__ = ["BIAS_FIELDS", "FORM_FIELDS", "POOL_FIELDS", "Recipe"]

# The fields by concern. Drawn from a pool, in the order they are drawn: first, so that a covering plan
# (flashcheck.inputs.covering) can pin them by the first choices of a case. The variant features come
# last: a kernel that declares none draws them from pools of one ("none"), which take no choice.
POOL_FIELDS = ("dtype", "values", "mask", "causal", "scale", "layout") + FEATURES + ("packing", "pages", "poison",
                                                                                     "seqused", "form_values")
BIAS_FIELDS = RECIPE_SETTINGS  # filled from the spec, after the pooled fields
_FORM_NUMBERS = ("shared_kv", "base_scale")  # set by a form's FormDraws (flashcheck.features.forms)
_UNSET = (False, None, "none")
FORM_FIELDS = ("packing", "pages", "poison", "form", "same_lengths", "seqused", "form_values") + _FORM_NUMBERS


@dataclass(frozen=True)
class Recipe:
    """Everything needed to rebuild one generated case exactly.

    Each feature's regime and each of the settings reads as an attribute too (``recipe.<feature>``, "none" where
    the recipe does not use it; ``recipe.<setting>``, None), and the recipe saves and prints as the flat record
    it was before the features had a record of their own: :meth:`as_dict`, ``repr``."""

    # The dense case: its shapes, dtype and regimes (flashcheck.inputs.regimes), the seed of its numbers.
    shapes: Shapes
    dtype: str
    values: str = "random"
    mask: str = "none"
    causal: str = "none"
    scale: str = "default"
    layout: str = "contiguous"
    seed: int = 0
    # The variant: the regime of each feature the case uses (flashcheck.inputs.variant_regimes), and what the
    # kernel's spec asks of them (RECIPE_SETTINGS; each feature's ``settings``): both in their own order.
    variants: dict[str, str] = field(default_factory=dict)
    settings: dict[str, str] = field(default_factory=dict)
    # The serving form (flashcheck.contract.forms) and its physical regimes (flashcheck.inputs.packing),
    # "none" for the dense form.
    packing: str = "none"
    pages: str = "none"
    poison: str = "none"
    form: str = "dense"
    same_lengths: bool = False  # each sequence's queries are its keys (a spec with equal_lengths)
    seqused: str = "none"  # the seqused_k of a kernel that takes it (flashcheck.inputs.packing.SEQUSED_REGIMES)
    elements: str = "none"  # "past_int32": the batch grown past INT32_ELEMENTS (ELEMENT_REGIMES)
    # A form's own numbers (flashcheck.features.forms.FormDraws): V as K's first Dv columns, bit for bit (MLA's one
    # cached row), and the scale the scale regime starts from (None: 1/sqrt(D)).
    shared_kv: bool = False
    base_scale: float | None = None
    form_values: str = "none"  # the form's own value regime (flashcheck.features.forms: Form.values)

    def __post_init__(self):
        unknown = set(self.variants) - set(FEATURES) or set(self.settings) - set(RECIPE_SETTINGS)
        if unknown:
            raise InvalidArgument("recipe", sorted(unknown), "not a feature or a setting of one",
                                  f"Name features of {list(FEATURES)} and settings of {list(RECIPE_SETTINGS)}.")
        # "none" and None are no part: left out, so that equal recipes compare equal
        object.__setattr__(self, "variants", {f: self.variants[f] for f in FEATURES
                                              if self.variants.get(f, "none") != "none"})
        object.__setattr__(self, "settings", {s: self.settings[s] for s in RECIPE_SETTINGS
                                              if self.settings.get(s) is not None})

    def __getattr__(self, name: str):
        # Only for names that are no field: a feature's regime or a setting, as the flat record had them.
        if name in FEATURES:
            return self.__dict__.get("variants", {}).get(name, "none")
        if name in RECIPE_SETTINGS:
            return self.__dict__.get("settings", {}).get(name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _flat(self, *, every: bool) -> dict:
        """The fields with each feature's regime and each setting in place of the two mappings; ``every``: the
        unused ones too ("none", None)."""
        out = {}
        for f in dataclasses.fields(self):
            if f.name == "variants":
                out.update({name: getattr(self, name) for name in FEATURES if every or name in self.variants})
            elif f.name == "settings":
                out.update({name: getattr(self, name) for name in RECIPE_SETTINGS if every or name in self.settings})
            else:
                out[f.name] = getattr(self, f.name)
        return out

    def __repr__(self) -> str:
        # a form's own numbers only where it sets them: a plain recipe reads as it did before them
        fields = {k: v for k, v in self._flat(every=True).items() if k not in _FORM_NUMBERS + ("form_values",) or v not in _UNSET}
        return f"{type(self).__name__}(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"

    def __hash__(self) -> int:
        return hash(tuple(self._flat(every=True).items()))

    @property
    def regime(self) -> str:
        used = "".join(f"/{f}={name}" for f, name in self.variants.items())
        form = "" if self.form == "dense" else f"/{self.form}={self.packing}" + (
            f",pages={self.pages}" if forms.form(self.form).pool == "pages" else "") + (
            f",seqused_k={self.seqused}" if self.seqused != "none" else "")
        scales = regime_text(self.seed, self.scheme) if self._holds_codes or self._inside else ""
        large = "" if self.elements == "none" else f"/elements={self.elements}"
        own = "" if self.form_values == "none" else f"/{self.form_values}"
        return f"{self.values}/{self.mask}{own}{used}{form}{scales}{large}"

    @property
    def _inside(self) -> bool:
        """Whether the recipe's kernel quantizes its inputs itself (its scheme names a quantizer)."""
        return scheme_named(self.scheme).quantizer is not None

    @property
    def _holds_codes(self) -> bool:
        """Whether the case's inputs hold codes of its scheme (fp8 inputs, or codes held in the compute format)."""
        return scheme_named(self.scheme).holds_codes(self.dtype)

    @property
    def scheme(self):
        """The quantization scheme of an fp8 case's scales (FA3's per-head descales unless the spec named one)."""
        return self.settings.get("quantization") or "per_head"

    def build(self, *, kernel: str | None = None, draw_on=None) -> AttentionCase | ServingCase:
        """The case; ``draw_on`` (a device, default the CPU) draws its dense tensors there and keeps q, k, v and
        the mask there (:mod:`flashcheck.inputs.drawing`: the same recipe, other numbers than the CPU's, and
        the case's ``provenance["drawn_on"]`` says where). A serving form's case is packed on the CPU."""
        with drawing_on(draw_on):
            case = self._dense(kernel)
        if self.form == "dense":
            return case
        return serving_case(case.on("cpu"), form=self.form, packing=self.packing, pages=self.pages,
                            poison=self.poison, seed=self.seed, same_lengths=self.same_lengths, seqused=self.seqused)

    def _drawn(self) -> tuple:
        """q, k and v as the value regimes draw them, before any quantization (fp8 inputs' in fp16)."""
        q, k, v = make_values(self.values, shapes=self.shapes, seed=self.seed,
                              dtype=VALUE_FORMAT if is_quantized(self.dtype) else self.dtype)
        q, k, v = form_values(self.form_values, q, k, v, self.shapes)
        if self._inside and inside_regime(self.seed) == "k_mean":
            k = with_k_mean(k, self.seed)
        return q, k, v

    def _dense(self, kernel: str | None) -> AttentionCase:
        s = self.shapes
        q, k, v = self._drawn()
        # Each draw has its own generator (of the seed): the variant's does not depend on the values'.
        drawing = {**self.settings, "bias_dtype": self.settings.get("bias_dtype") or self.dtype}
        variant = make_variant(self.variants, shapes=s, seed=self.seed, drawing=drawing, **settings_of(self.settings))
        if self._holds_codes:
            q, k, v, variant = quantize(q, k, v, variant, shapes=s, dtype=self.dtype, seed=self.seed,
                                        scheme=self.scheme)
        if self.layout == "expanded":
            # Stride-0 heads can only hold equal heads: keep head 0 of k and v everywhere.
            k, v = (t[:, :1].expand_as(t).contiguous() for t in (k, v))
        scale = make_scale(self.scale, head_dim=s.head_dim, base=self.base_scale)
        variant, k = fit_to_values(self.variants, variant, q, k, scale)
        if self.shared_kv:  # after every rounding, so that V holds K's own bits, and its scales
            v, variant = k[..., :s.head_dim_v].contiguous(), shared_scales(variant, s.head_dim_v)
        return AttentionCase.create(
            q, k, v, scale=scale, causal=self.causal,
            attn_mask=make_mask(self.mask, shapes=s, seed=self.seed), layout=self.layout,
            provenance={"seed": self.seed, "strategy": self.regime, "kernel": kernel,
                        "recipe": self.as_dict(), **drawn_on(q)},
            variant=variant)

    def source_values(self):
        """A dense quantized recipe's q, k and v before their quantization (fp32), V cut from K's where it shares
        K's row; None where the recipe reshapes its values after it (an expanded layout, a variant regime fitted
        to the values)."""
        fitted = any(self.variants.get(f.name, "none") in f.fitted for f in REGISTRY)
        if not self._holds_codes or self.form != "dense" or self.layout == "expanded" or fitted:
            return None
        s, source = self.shapes, []
        q, k, v = self._drawn()
        quantize(q, k, v, Variant(), shapes=s, dtype=self.dtype, seed=self.seed, scheme=self.scheme, source=source)
        if self.shared_kv:
            source[2] = source[1][..., :s.head_dim_v]
        return tuple(source)

    def as_dict(self) -> dict:
        """The flat record saved cases hold: the parts a recipe does not use left out, so that a plain recipe is
        saved as before the variants and forms."""
        out = self._flat(every=False)
        out["shapes"] = dataclasses.asdict(self.shapes)
        for name in FORM_FIELDS + ("elements",):
            if out[name] in ("none", "dense", False, None):
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "Recipe":
        """The recipe of :meth:`as_dict`'s record."""
        data = dict(data)
        data["shapes"] = Shapes(**data["shapes"])
        variants = {name: data.pop(name) for name in FEATURES if name in data}
        settings = {name: data.pop(name) for name in RECIPE_SETTINGS if name in data}
        return cls(**data, variants=variants, settings=settings)
