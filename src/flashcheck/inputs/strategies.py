"""Hypothesis strategies for attention inputs, driven by a kernel spec.

A drawn :class:`Recipe` names a shape, a dtype, a value regime, a mask regime, a causal alignment, a
scale regime, a memory layout and a seed; :meth:`Recipe.build` turns it into an
:class:`~flashcheck.inputs.case.AttentionCase`. Hypothesis shrinks the recipe (smaller N and D, the simpler
regimes listed first), never element by element, so a failing case ends up small and replayable.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from hypothesis import HealthCheck, assume
from hypothesis import strategies as st

from ..contract.formats import ALL_DTYPES, FP8_DTYPES
from ..contract.spec import DEFAULT_SPEC, KernelSpec
from ..contract.validation import Shapes
from ..contract.variants import FEATURES, declared
from ..errors import InvalidArgument
from .case import AttentionCase
from .drawing import drawing_on
from .layout import layouts as layout_names
from .packing import LENGTH_REGIMES, PAGE_REGIMES, SEQUSED_REGIMES, serving_case
from .presets import token_cap_problem
from .quantization import VALUE_FORMAT, descale_regime, quantize
from .regimes import (
    MASK_REGIMES,
    SCALE_REGIMES,
    VALUE_REGIMES,
    make_mask,
    make_scale,
    make_values,
)
from .serving import POISONS, ServingCase
from .shape_draws import MAX_DECODE_QUERIES, SPECIAL_LENGTHS, shapes
from .sizes import ELEMENT_REGIMES, INT32_ELEMENTS, LARGE_DTYPES, past_int32
from .variant_regimes import VARIANT_REGIMES, WIDE_BIASES, make_variant

__all__ = ["INT32_ELEMENTS", "POOL_FIELDS", "Recipe", "SPECIAL_LENGTHS", "cases", "draw_recipes", "past_int32",
           "recipe_pools", "recipes", "shapes", "without_local_constants"]

# Simplest first: hypothesis shrinks towards the start of each list.
VALUE_ORDER = ("random", "flat", "peaked", "growing_max", "positive_v", "cancelling_v", "ties",
               "near_ties", "huge_logits", "subnormal_p", "tiny_values", "flat_large_v", "coherent_p_rounding")
MASK_ORDER = ("none", "key_padding_right", "key_padding_left", "sliding_window", "random", "fully_masked_rows")
LAYOUT_ORDER = ("contiguous", "transposed", "strided", "offset", "expanded")
assert set(VALUE_ORDER) == set(VALUE_REGIMES) and set(MASK_ORDER) == set(MASK_REGIMES)
assert set(LAYOUT_ORDER) == set(layout_names())


@dataclass(frozen=True)
class Recipe:
    """Everything needed to rebuild one generated case exactly."""

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


def _subset(argument: str, chosen, allowed_order, *, allow_empty: bool = False):
    if chosen is None:
        return list(allowed_order)
    chosen = [chosen] if isinstance(chosen, str) else list(chosen)
    bad = [c for c in chosen if c not in allowed_order]
    if bad or not (chosen or allow_empty):
        raise InvalidArgument(argument, chosen, f"unknown {argument} {bad}" if bad else "empty",
                              f"Choose from {list(allowed_order)}.")
    return [c for c in allowed_order if c in chosen]


BIAS_FIELDS = ("alibi_mode", "bias_order", "bias_dtype")  # filled from the spec, after the pooled fields


def _bias_fields(draw, spec: KernelSpec, fields: dict) -> dict:
    """The spec's ALiBi mode and bias order where the recipe uses them, and the bias's dtype: the inputs',
    or fp32 where the spec takes it (always for a regime past fp16's range, which an fp16 bias cannot hold)."""
    alibi, bias, capped = (fields[f] != "none" for f in ("alibi_slopes", "attn_bias", "softcap"))
    out = {"alibi_mode": spec.alibi if alibi else None,
           "bias_order": spec.bias_order if capped and (alibi or bias) else None, "bias_dtype": None}
    if bias:
        wide, dtype = fields["attn_bias"] in WIDE_BIASES, fields["dtype"]
        if spec.fp32_bias and dtype != "fp32":
            dtype = "fp32" if wide else draw(st.sampled_from((dtype, "fp32")))
        assume(not (wide and dtype == "fp16"))
        out["bias_dtype"] = dtype
    return out


# The fields of a recipe drawn from a pool, in the order they are drawn: first, so that a covering plan
# (flashcheck.inputs.covering) can pin them by the first choices of a case. The variant features come
# last: a kernel that declares none draws them from pools of one ("none"), which take no choice.
POOL_FIELDS = ("dtype", "values", "mask", "causal", "scale", "layout") + FEATURES + ("packing", "pages", "poison",
                                                                                     "seqused")
FORM_FIELDS = ("packing", "pages", "poison", "form", "same_lengths", "seqused")
# Serving batches: up to max(max_batch, 8) sequences (a paged kernel's decode step: MAX_DECODE_QUERIES).
MIN_SERVING_BATCH = 8


def _form_pools(spec: KernelSpec) -> dict[str, list]:
    if spec.form == "dense":  # no pools at all: the covering plan and the draws stay those of before the forms
        return {}
    pages = ["none"]
    if spec.form == "paged":
        pages = [p for p in PAGE_REGIMES if spec.page_sizes is None or p == "nondividing" or int(p) in spec.page_sizes]
        if spec.page_sizes is not None:
            pages = [p for p in pages if p != "nondividing"] or [str(spec.page_sizes[0])]
    packing = _allowed("packing", list(LENGTH_REGIMES), "empty_sequences", "empty_sequences", spec)
    packing = _allowed("packing", packing, "fewer_tokens_than_batch", "empty_sequences", spec)
    pools = {"packing": packing, "pages": pages, "poison": list(POISONS) if spec.nan_safe_masking else ["huge"]}
    # only a kernel that takes seqused_k has the pool: the others' draws stay those of before it
    return {**pools, "seqused": list(SEQUSED_REGIMES)} if spec.seqused_k else pools


def _variant_pools(spec: KernelSpec, variants) -> dict[str, list]:
    """Each variant feature's regimes where the spec declares it and ``variants`` (None: all) names it."""
    chosen = set(_subset("variants", variants, FEATURES, allow_empty=True))
    pools = {f: list(VARIANT_REGIMES[f]) if f in declared(spec) and f in chosen else ["none"] for f in FEATURES}
    if not spec.fp32_bias and set(spec.dtypes) == {"fp16"}:  # no bias the kernel takes holds them
        pools["attn_bias"] = [b for b in pools["attn_bias"] if b not in WIDE_BIASES]
    return pools


def recipe_pools(*, spec: KernelSpec = DEFAULT_SPEC, dtypes=None, value_regimes=None, mask_regimes=None,
                 scale_regimes=None, layouts=None, variants=None, **sizes) -> dict[str, list]:
    """What :func:`recipes` draws each of :data:`POOL_FIELDS` from, in its order (simplest first); the
    size options of :func:`recipes` (``sizes``) leave the pools as they are. ``variants``: the variant
    features to draw (default: every one the spec declares; ``()``: none)."""
    dtype_pool = [d for d in _subset("dtypes", dtypes, ALL_DTYPES) if d in spec.dtypes]
    if not dtype_pool:
        raise InvalidArgument("dtypes", dtypes, f"the kernel supports only {spec.dtypes}",
                              "Pick dtypes the kernel spec declares.")
    masks_pool = _subset("mask_regimes", mask_regimes, MASK_ORDER)
    if not spec.attn_mask:
        masks_pool = [m for m in masks_pool if m == "none"] or ["none"]
    scales_pool = _allowed("scale_regimes", _subset("scale_regimes", scale_regimes, SCALE_REGIMES), "negative",
                           "negative_scale", spec)
    scales_pool = _allowed("scale_regimes", scales_pool, "tiny", "tiny_scale", spec)
    layouts_pool = _allowed("layouts", _subset("layouts", layouts, LAYOUT_ORDER), "expanded", "stride0_heads", spec)
    if spec.form != "dense":  # the form's own physical layout replaces the dense layouts
        layouts_pool = ["contiguous"]
    return {"dtype": dtype_pool, "values": _subset("value_regimes", value_regimes, VALUE_ORDER), "mask": masks_pool,
            "causal": list(spec.causal), "scale": scales_pool, "layout": layouts_pool,
            **_variant_pools(spec, variants), **_form_pools(spec)}


def recipes(*, spec: KernelSpec = DEFAULT_SPEC, dtypes=None, value_regimes=None, mask_regimes=None,
            scale_regimes=None, layouts=None, variants=None, min_n: int = 1, max_n: int = 256, max_batch: int = 2,
            max_heads: int = 4, head_dims=None, max_queries: int | None = None,
            max_total_tokens: int | None = None, max_decode_n: int | None = None,
            large_tensors: bool = False) -> st.SearchStrategy[Recipe]:
    """Recipes of cases the spec supports, over the chosen regimes: the pooled fields first
    (:data:`POOL_FIELDS`), then the shapes, then the seed of the values. ``max_queries`` and ``max_decode_n``:
    see :func:`shapes` (a paged kernel's at most 16); ``max_total_tokens``: the batch cut so that batch x (Nq + Nk)
    stays within it; ``large_tensors``: one recipe in eight of 16-bit inputs grows its batch until its largest
    tensor passes 2^31 elements (the cap does not apply to it). The options are checked here, once."""
    problem = token_cap_problem(max_total_tokens, max_n, max_queries)
    if problem:
        raise InvalidArgument("max_total_tokens", max_total_tokens, problem,
                              "Raise max_total_tokens or lower max_n and max_queries.")
    pools = recipe_pools(spec=spec, dtypes=dtypes, value_regimes=value_regimes, mask_regimes=mask_regimes,
                         scale_regimes=scale_regimes, layouts=layouts, variants=variants)
    if max_queries is not None and spec.form == "paged":
        max_queries = min(max_queries, MAX_DECODE_QUERIES)
    return _recipes(_RecipeDraws(
        spec=spec, fields={name: st.sampled_from(pools[name]) for name in POOL_FIELDS if name in pools},
        shapes=shapes(spec=spec, min_n=min_n, max_n=max_n, max_batch=max_batch, max_heads=max_heads,
                      head_dims=head_dims, max_queries=max_queries, max_decode_n=max_decode_n),
        serving_batch=st.integers(1, max(max_batch, MIN_SERVING_BATCH)) if spec.form != "dense" else None,
        elements=st.sampled_from(ELEMENT_REGIMES) if large_tensors and spec.form == "dense" else None,
        max_total_tokens=max_total_tokens))


@dataclass(frozen=True)
class _RecipeDraws:
    """The strategies of one :func:`recipes` call."""

    spec: KernelSpec
    fields: dict          # pooled field -> its strategy, in POOL_FIELDS order
    shapes: object
    serving_batch: object  # a serving form's batch (None: the dense form)
    elements: object       # past_int32 or not, for 16-bit inputs (None: never)
    max_total_tokens: int | None


_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def _recipes(draw, d: _RecipeDraws) -> Recipe:
    spec = d.spec
    fields = {name: draw(strategy) for name, strategy in d.fields.items()}
    s = draw(d.shapes)
    if d.serving_batch is not None:
        s = dataclasses.replace(s, batch=draw(d.serving_batch),
                                n_q=min(s.n_q, MAX_DECODE_QUERIES) if spec.form == "paged" else s.n_q)
        fields["form"], fields["same_lengths"] = spec.form, spec.equal_lengths
    if d.elements is not None and fields["dtype"] in LARGE_DTYPES:
        fields["elements"] = draw(d.elements)
    if fields.get("elements") == "past_int32":
        s = past_int32(s)
    elif d.max_total_tokens is not None:
        s = dataclasses.replace(s, batch=max(1, min(s.batch, d.max_total_tokens // (s.n_q + s.n_k))))
    # empty_sequences over a batch of one is the batch without tokens
    assume(not ("empty_batch" in spec.excludes and fields.get("packing") == "empty_sequences" and s.batch == 1))
    if fields["causal"] == "bottom_right" and s.n_q > s.n_k and "bottom_right_more_queries" in spec.excludes:
        s = dataclasses.replace(s, n_q=s.n_k, n_k=s.n_q)  # the same lengths the other way round
    fields.update(_bias_fields(draw, spec, fields))
    return Recipe(shapes=s, seed=draw(_SEEDS), **fields)


def _allowed(argument: str, pool: list, regime: str, exclusion: str, spec: KernelSpec) -> list:
    """``pool`` without ``regime`` when the spec excludes it; an error when nothing is left."""
    if exclusion not in spec.excludes:
        return pool
    kept = [x for x in pool if x != regime]
    if not kept:
        raise InvalidArgument(argument, pool, f"the kernel spec excludes {exclusion!r}",
                              f"Choose {argument} other than {regime!r} for this kernel.")
    return kept


def cases(**options) -> st.SearchStrategy[AttentionCase]:
    """AttentionCases built from :func:`recipes` (same keyword-only options)."""
    return recipes(**options).map(lambda r: r.build())


@contextlib.contextmanager
def without_local_constants():
    """Hypothesis draws, now and then, a literal found in any loaded local module (the calling script,
    test files, an editable install): the same seed then gave another case list from another caller.
    Fixed lists leave those literals out (hypothesis has no setting for it, hence its internals)."""
    try:
        from hypothesis.internal.conjecture import providers

        original, cache, empty = providers._get_local_constants, providers.CONSTANTS_CACHE.cache, providers.Constants
    except (ImportError, AttributeError):  # another hypothesis: its draws as they come
        yield
        return
    providers._get_local_constants = empty
    cache.clear()  # its entries hold the local literals
    try:
        yield
    finally:
        providers._get_local_constants = original
        cache.clear()


def draw_recipes(count: int, *, seed: int = 0, **options) -> list[Recipe]:
    """``count`` recipes from :func:`recipes`, the same list for the same seed: first the covering order
    (:mod:`flashcheck.inputs.covering`: every value regime as designed, every value of every other pooled
    field, then their pairs), then hypothesis's own draws (small and edge-case shapes early, larger
    ones later). For fixed case lists (self-tests, benchmarks) that meet every regime early, as
    campaigns and property tests do."""
    from hypothesis import Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from .covering import covering_plan, covering_size, planned_choices

    strategy, pools = recipes(**options), recipe_pools(**options)
    planned = []
    with without_local_constants():
        for i, cell in enumerate(covering_plan(pools, seed=seed, limit=covering_size(pools, count))):
            found = planned_choices(strategy, pools, cell, seed=hash((seed, i)))
            if found is not None:
                planned.append(found[1])
    drawn: list[Recipe] = []

    @hypothesis_seed(seed)
    @settings(max_examples=max(count - len(planned), 1), database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(recipe=strategy)
    def collect(recipe):
        drawn.append(recipe)

    with without_local_constants():
        collect()
    return (planned + drawn)[:count]