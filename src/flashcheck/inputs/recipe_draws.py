"""Hypothesis strategies over recipes (:class:`~flashcheck.inputs.recipe.Recipe`), driven by a kernel spec:
the public ``flashcheck.strategies``.

:func:`recipes` draws recipes of the cases a spec supports, over the regimes and sizes of a
:class:`RecipeOptions`; :func:`cases` builds them. Hypothesis shrinks the recipe (smaller N and D, the simpler
regimes listed first), never element by element, so a failing case ends up small and replayable.
:func:`draw_recipes` gives a fixed list: the covering order first (:mod:`flashcheck.inputs.covering`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..contract.formats import ALL_DTYPES
from ..contract.spec import DEFAULT_SPEC, KernelSpec
from ..errors import InvalidArgument
from ..features.forms import form, form_draws, value_pools
from ..features.registry import REGISTRY
from ..features.variant import FEATURES, declared
from ..hypothesis_internals import without_local_constants
from .case import AttentionCase
from .covering import covering_plan, covering_size, planned_choices
from .layout import layouts as layout_names
from .options import Options
from .packing import LENGTH_REGIMES
from .presets import token_cap_problem
from .recipe import POOL_FIELDS, Recipe
from .regimes import FEATURE_MASKS, MASK_REGIMES, SCALE_REGIMES, VALUE_REGIMES
from .serving import POISONS
from .shape_draws import MAX_DECODE_QUERIES, SPECIAL_LENGTHS, shapes
from .sizes import ELEMENT_REGIMES, INT32_ELEMENTS, LARGE_DTYPES, past_int32
from .variant_regimes import VARIANT_REGIMES

__all__ = ["INT32_ELEMENTS", "POOL_FIELDS", "Recipe", "RecipeOptions", "SPECIAL_LENGTHS", "cases", "draw_recipes",
           "past_int32", "recipe_pools", "recipes", "shapes", "without_local_constants"]

# Simplest first: hypothesis shrinks towards the start of each list.
VALUE_ORDER = ("random", "flat", "peaked", "growing_max", "positive_v", "cancelling_v", "ties",
               "near_ties", "huge_logits", "subnormal_p", "tiny_values", "flat_large_v", "coherent_p_rounding")
MASK_ORDER = ("none", "key_padding_right", "key_padding_left") + tuple(FEATURE_MASKS) + ("random", "fully_masked_rows")
LAYOUT_ORDER = ("contiguous", "transposed", "strided", "offset", "expanded")
assert set(VALUE_ORDER) == set(VALUE_REGIMES) and set(MASK_ORDER) == set(MASK_REGIMES)
assert set(LAYOUT_ORDER) == set(layout_names())


def _subset(argument: str, chosen, allowed_order, *, allow_empty: bool = False):
    if chosen is None:
        return list(allowed_order)
    chosen = [chosen] if isinstance(chosen, str) else list(chosen)
    bad = [c for c in chosen if c not in allowed_order]
    if bad or not (chosen or allow_empty):
        raise InvalidArgument(argument, chosen, f"unknown {argument} {bad}" if bad else "empty",
                              f"Choose from {list(allowed_order)}.")
    return [c for c in allowed_order if c in chosen]


def _settings(draw, spec: KernelSpec, fields: dict) -> dict:
    """What the spec asks of the features the recipe uses (each feature's ``settings``, a choice among several
    drawn), its bias order where a cap and a bias meet and its block-scaled quantization scheme; a draw no setting
    fits is rejected."""
    used = [f for f in REGISTRY if fields[f.name] != "none"]
    out = {}
    for f in used:
        settings = f.settings(spec, fields["dtype"], fields[f.name], lambda options: draw(st.sampled_from(options)))
        assume(settings is not None)
        out.update(settings)
    if {"cap", "bias"} <= {f.term for f in used}:
        out["bias_order"] = spec.bias_order
    scheme = spec.quantization
    if (scheme.holds_codes(fields["dtype"]) and (scheme.block_scaled or scheme.held_codes)) or scheme.quantizer:
        out["quantization"] = scheme.as_dict()
    return out


# Serving batches: up to max(max_batch, 8) sequences (a decode step's queries: MAX_DECODE_QUERIES).
MIN_SERVING_BATCH = 8


def _form_pools(spec: KernelSpec) -> dict[str, list]:
    if spec.form == "dense":  # no pools at all: the covering plan and the draws stay those of before the forms
        return {}
    packing = _allowed("packing", list(LENGTH_REGIMES), "empty_sequences", "empty_sequences", spec)
    packing = _allowed("packing", packing, "fewer_tokens_than_batch", "empty_sequences", spec)
    pools = {"packing": packing, "pages": ["none"], "poison": list(POISONS) if spec.nan_safe_masking else ["huge"]}
    return {**pools, **form(spec.form).pools(spec)}


def _variant_pools(spec: KernelSpec, variants) -> dict[str, list]:
    """Each variant feature's regimes where the spec declares it and ``variants`` (None: all) names it, or requires
    it (then never "none": the kernel cannot be called without it)."""
    chosen = set(_subset("variants", variants, FEATURES, allow_empty=True))
    pools = {}
    for f in REGISTRY:
        required = f.required(spec)
        if f.name not in declared(spec) or not (f.name in chosen or required):
            pools[f.name] = ["none"]
            continue
        pools[f.name] = [r for r in VARIANT_REGIMES[f.name] if _takes(spec, f, r) and not (required and r == "none")]
    return pools


def _takes(spec: KernelSpec, feature, regime: str) -> bool:
    """Whether the spec takes a case of ``regime`` in one of its dtypes (its settings fit; where they choose, the
    first option, since each is one the spec takes)."""
    return regime == "none" or any(feature.settings(spec, dtype, regime, lambda options: options[0]) is not None
                                   for dtype in spec.dtypes)


@dataclass(frozen=True)
class RecipeOptions(Options):
    """What :func:`recipes` draws from: a kernel's spec, the regimes of its pools and the sizes of its shapes.
    :func:`recipe_pools` checks the pools, :func:`recipes` and :func:`shapes` the sizes."""

    spec: KernelSpec = DEFAULT_SPEC
    # The pools (recipe_pools), each None for every value the spec allows.
    dtypes: tuple | list | None = None
    value_regimes: tuple | list | None = None
    mask_regimes: tuple | list | None = None
    scale_regimes: tuple | list | None = None
    layouts: tuple | list | None = None
    variants: tuple | list | None = None  # the variant features to draw (None: all the spec declares; (): none)
    form_values: tuple | list | None = None  # the form's own value regimes ("none" and these; None: all it has)
    # The shapes (see shapes(); max_queries is at most 16 for a form of decode steps).
    min_n: int = 1
    max_n: int = 256
    max_batch: int = 2
    max_heads: int = 4
    head_dims: tuple | list | None = None
    max_queries: int | None = None
    max_decode_n: int | None = None
    max_total_tokens: int | None = None  # the batch cut so that batch x (Nq + Nk) stays within it
    large_tensors: bool = False  # one 16-bit recipe in eight grown past 2^31 elements (uncapped)


def recipe_pools(options: RecipeOptions | None = None, /, **keywords) -> dict[str, list]:
    """What :func:`recipes` draws each of :data:`POOL_FIELDS` from, in its order (simplest first), for
    ``options`` or its fields as keywords; the sizes leave the pools as they are."""
    o = RecipeOptions.of(options, keywords)
    spec = o.spec
    dtype_pool = [d for d in _subset("dtypes", o.dtypes, ALL_DTYPES) if d in spec.dtypes]
    if not dtype_pool:
        raise InvalidArgument("dtypes", o.dtypes, f"the kernel supports only {spec.dtypes}",
                              "Pick dtypes the kernel spec declares.")
    masks_pool = _subset("mask_regimes", o.mask_regimes, MASK_ORDER)
    if not spec.attn_mask:
        masks_pool = [m for m in masks_pool if m == "none"] or ["none"]
    scales_pool = _allowed("scale_regimes", _subset("scale_regimes", o.scale_regimes, SCALE_REGIMES), "negative",
                           "negative_scale", spec)
    scales_pool = _allowed("scale_regimes", scales_pool, "tiny", "tiny_scale", spec)
    layouts_pool = _allowed("layouts", _subset("layouts", o.layouts, LAYOUT_ORDER), "expanded", "stride0_heads", spec)
    if spec.form != "dense":  # the form's own physical layout replaces the dense layouts
        layouts_pool = ["contiguous"]
    return {"dtype": dtype_pool, "values": _subset("value_regimes", o.value_regimes, VALUE_ORDER),
            "mask": masks_pool, "causal": list(spec.causal), "scale": scales_pool, "layout": layouts_pool,
            **_variant_pools(spec, o.variants), **_form_pools(spec), **value_pools(spec, o.form_values)}


def recipes(options: RecipeOptions | None = None, /, **keywords) -> st.SearchStrategy[Recipe]:
    """Recipes of cases the spec supports, over the regimes and sizes of ``options`` or its fields as keywords
    (``recipes(spec=attention.spec, max_n=64)``): the pooled fields first (:data:`POOL_FIELDS`), then the
    shapes, then the seed of the values. The options are checked here, once."""
    o = RecipeOptions.of(options, keywords)
    problem = token_cap_problem(o.max_total_tokens, o.max_n, o.max_queries)
    if problem:
        raise InvalidArgument("max_total_tokens", o.max_total_tokens, problem,
                              "Raise max_total_tokens or lower max_n and max_queries.")
    pools = recipe_pools(o)
    spec, max_queries = o.spec, o.max_queries
    if max_queries is not None and form(spec.form).decode:
        max_queries = min(max_queries, MAX_DECODE_QUERIES)
    return _recipes(_RecipeDraws(
        spec=spec, fields={name: st.sampled_from(pools[name]) for name in POOL_FIELDS if name in pools},
        shapes=shapes(spec=spec, min_n=o.min_n, max_n=o.max_n, max_batch=o.max_batch, max_heads=o.max_heads,
                      head_dims=o.head_dims, max_queries=max_queries, max_decode_n=o.max_decode_n),
        serving_batch=st.integers(1, max(o.max_batch, MIN_SERVING_BATCH)) if spec.form != "dense" else None,
        elements=st.sampled_from(ELEMENT_REGIMES) if o.large_tensors and spec.form == "dense" else None,
        max_total_tokens=o.max_total_tokens, numbers=_form_numbers(spec)))


def _form_numbers(spec: KernelSpec) -> dict:
    """The recipe fields a form fixes of its cases' numbers (:class:`~flashcheck.features.forms.FormDraws`)."""
    fixed = form_draws(spec)
    return {} if fixed is None else {"shared_kv": fixed.shared_kv, "base_scale": fixed.base_scale}


@dataclass(frozen=True)
class _RecipeDraws:
    """The strategies of one :func:`recipes` call."""

    spec: KernelSpec
    fields: dict          # pooled field -> its strategy, in POOL_FIELDS order
    shapes: object
    serving_batch: object  # a serving form's batch (None: the dense form)
    elements: object       # past_int32 or not, for 16-bit inputs (None: never)
    max_total_tokens: int | None
    numbers: dict          # the recipe fields a form fixes (shared_kv, base_scale), the same for every case


_SEEDS = st.integers(0, 2**32 - 1)


@st.composite
def _recipes(draw, d: _RecipeDraws) -> Recipe:
    spec = d.spec
    fields = {name: draw(strategy) for name, strategy in d.fields.items()}
    s = draw(d.shapes)
    if d.serving_batch is not None:
        s = dataclasses.replace(s, batch=draw(d.serving_batch),
                                n_q=min(s.n_q, MAX_DECODE_QUERIES) if form(spec.form).decode else s.n_q)
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
    settings = _settings(draw, spec, fields)
    variants = {name: fields.pop(name) for name in FEATURES}
    return Recipe(shapes=s, seed=draw(_SEEDS), variants=variants, settings=settings, **fields, **d.numbers)


def _allowed(argument: str, pool: list, regime: str, exclusion: str, spec: KernelSpec) -> list:
    """``pool`` without ``regime`` when the spec excludes it; an error when nothing is left."""
    if exclusion not in spec.excludes:
        return pool
    kept = [x for x in pool if x != regime]
    if not kept:
        raise InvalidArgument(argument, pool, f"the kernel spec excludes {exclusion!r}",
                              f"Choose {argument} other than {regime!r} for this kernel.")
    return kept


def cases(options: RecipeOptions | None = None, /, **keywords) -> st.SearchStrategy[AttentionCase]:
    """AttentionCases built from :func:`recipes` (the same options)."""
    return recipes(options, **keywords).map(lambda r: r.build())


def draw_recipes(count: int, options: RecipeOptions | None = None, /, *, seed: int = 0, **keywords) -> list[Recipe]:
    """``count`` recipes from :func:`recipes`, the same list for the same seed: first the covering order
    (:mod:`flashcheck.inputs.covering`: every value regime as designed, every value of every other pooled
    field, then their pairs), then hypothesis's own draws (small and edge-case shapes early, larger
    ones later). For fixed case lists (self-tests, benchmarks) that meet every regime early, as
    campaigns and property tests do."""
    o = RecipeOptions.of(options, keywords)
    strategy, pools = recipes(o), recipe_pools(o)
    planned = []
    with without_local_constants():
        for i, cell in enumerate(covering_plan(pools, seed=seed, limit=covering_size(pools, count))):
            found = planned_choices(strategy, pools, cell, seed=hash((seed, i)))
            if found is not None:
                planned.append(found.value)
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
