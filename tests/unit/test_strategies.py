"""Strategies draw only what a kernel spec allows, and recipes rebuild their case exactly."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from hypothesis import given, settings

from flashcheck import InvalidArgument, KernelSpec
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import (
    LAYOUT_ORDER,
    MASK_ORDER,
    VALUE_ORDER,
    RecipeOptions,
    cases,
    draw_recipes,
    recipe_pools,
    recipes,
    shapes,
)
from flashcheck.inputs.regimes import SCALE_REGIMES, VALUE_REGIMES

NARROW = KernelSpec(dtypes=("fp16",), causal=("bottom_right",), attn_mask=False, gqa=False, head_dims=(64, 128),
                    seq_multiple=16, equal_lengths=True, max_seqlen=256)


@settings(max_examples=80, deadline=None)
@given(recipe=recipes(spec=NARROW, max_n=512))
def test_recipes_respect_a_narrow_spec(recipe):
    s = recipe.shapes
    assert recipe.dtype == "fp16" and recipe.causal == "bottom_right" and recipe.mask == "none"
    assert s.heads_q == s.heads_kv and s.head_dim in (64, 128) and s.head_dim_v == s.head_dim
    assert s.n_q == s.n_k and s.n_q % 16 == 0 and s.n_q <= 256
    assert NARROW.unsupported(s, dtype=recipe.dtype, causal=recipe.causal, has_mask=False) is None


@settings(max_examples=40, deadline=None)
@given(recipe=recipes(max_n=40))
def test_recipe_rebuilds_bit_identical_cases(recipe):
    a, b = recipe.build(), Recipe.from_dict(recipe.as_dict()).build()
    assert a.equal_bits(b)
    assert a.provenance["strategy"] == recipe.regime and a.provenance["seed"] == recipe.seed


@settings(max_examples=30, deadline=None)
@given(case=cases(spec=KernelSpec(causal=("none", "top_left"), attn_mask=True, gqa=True), max_n=24,
                  layouts=["expanded"]))
def test_expanded_layout_cases_are_buildable(case):
    k, v = case.to_device("cpu")[1:3]
    assert k.stride(1) == 0 and v.stride(1) == 0


def test_shapes_draws_tile_edge_lengths():
    seen = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(s=shapes(max_n=130))
    def collect(s):
        seen.update((s.n_q, s.n_k))

    collect()
    assert {1, 63, 64, 65, 127, 128, 129} & seen


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@pytest.mark.parametrize("kwargs, name", [
    (dict(dtypes=["fp64"]), "dtypes"),
    (dict(value_regimes=["nope"]), "value_regimes"),
    (dict(mask_regimes=[]), "mask_regimes"),
    (dict(layouts=["diagonal"]), "layouts"),
])
def test_bad_options_are_named(kwargs, name):
    with pytest.raises(InvalidArgument, match=f"^{name}="):
        recipes(**kwargs).example()


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_spec_without_the_requested_dtype():
    with pytest.raises(InvalidArgument, match="supports only"):
        recipes(spec=NARROW, dtypes=["bf16"]).example()


EXCLUDING = KernelSpec(causal=("bottom_right",), attn_mask=True, gqa=True,
                       excludes=("negative_scale", "bottom_right_more_queries", "stride0_heads"))


@settings(max_examples=150, deadline=None)
@given(recipe=recipes(spec=EXCLUDING, max_n=64))
def test_excluded_input_classes_are_not_drawn(recipe):
    assert recipe.scale != "negative" and recipe.layout != "expanded"
    assert recipe.shapes.n_q <= recipe.shapes.n_k


def test_unknown_exclusion_is_named():
    with pytest.raises(InvalidArgument, match="^excludes="):
        KernelSpec(excludes=("negative_scales",))


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
def test_asking_only_for_an_excluded_regime_is_an_error():
    with pytest.raises(InvalidArgument, match="^scale_regimes=.*excludes 'negative_scale'"):
        recipes(spec=EXCLUDING, scale_regimes=["negative"]).example()


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("head_dim", [16, 17, 24, 40, 64, 100, 128, 200, 256])
def test_coherent_p_rounding_puts_every_weight_under_a_bf16_midpoint(dtype, head_dim):
    # P = 0.5 + f 2^-9 with f in (0.6, 1): bf16 rounds every such P down by most of its half-spacing,
    # while a legal fp16 or tf32 P (spacing 2^-11) moves by a fifth of that at most.
    s = Shapes(1, 1, 2, 1, 50, head_dim, 8)
    q, k, v = (t.to(dtype).double() for t in VALUE_REGIMES["coherent_p_rounding"](torch.Generator().manual_seed(3), s, 65504.0))
    logits = q[0, 0] @ k[0, 0].T / math.sqrt(head_dim)
    p = torch.exp(logits - logits.max(dim=-1, keepdim=True).values)
    assert bool((p[:, 0] == 1).all())
    f = (p[:, 1:] - 0.5) / 2.0**-9
    assert 0.6 < float(f.min()) and float(f.max()) < 1.0
    assert bool((v == v[..., :1, :]).all())  # V constant along the keys


def test_fixed_case_lists_hold_every_value_regime_early():
    n = len(VALUE_ORDER)
    spec = KernelSpec(attn_mask=True, causal=("none", "top_left"))
    drawn = draw_recipes(2 * n, seed=0, max_n=64, spec=spec)
    early = drawn[:n + len(MASK_ORDER)]  # each regime once as designed, taking turns with the other fields
    designed = {r.values for r in early if (r.scale, r.mask, r.layout) == ("default", "none", "contiguous")}
    assert designed == set(VALUE_ORDER)
    assert {r.mask for r in early} == set(MASK_ORDER) and {r.layout for r in early} == set(LAYOUT_ORDER)
    assert {r.scale for r in early} == set(SCALE_REGIMES) and {r.causal for r in early} == set(spec.causal)
    assert drawn[1].scale != "default" or drawn[1].mask != "none"  # the other fields come from the start
    assert draw_recipes(2 * n, seed=0, max_n=64, spec=spec) == drawn  # the same list for the same seed
    assert draw_recipes(2 * n, seed=1, max_n=64, spec=spec) != drawn
    assert {r.values for r in draw_recipes(4, seed=0, max_n=64, value_regimes=["ties"])} == {"ties"}
    masked = draw_recipes(4, seed=0, max_n=64, mask_regimes=["random"], spec=KernelSpec(attn_mask=True))
    assert {r.mask for r in masked} == {"random"}


def test_fixed_case_lists_do_not_depend_on_the_modules_loaded(tmp_path, monkeypatch):
    """Hypothesis mixes literals from loaded local modules into its draws; a case list must be the
    same from the command line, from a test and from a user's script."""
    before = draw_recipes(60, seed=3, max_n=1024)
    literals = ", ".join(str(n) for n in range(5, 1100, 7))
    (tmp_path / "constants_of_some_script.py").write_text(f"SIZES = ({literals})\nSCALES = (0.37, -2.5, 1e-5)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    __import__("constants_of_some_script")
    try:
        assert draw_recipes(60, seed=3, max_n=1024) == before
    finally:
        del sys.modules["constants_of_some_script"]


def test_a_tiny_scale_exclusion_keeps_the_tiny_regime_out_and_the_others_in():
    from hypothesis import HealthCheck, given, settings

    from flashcheck.contract.spec import KernelSpec
    from flashcheck.inputs.recipe_draws import recipes

    spec = KernelSpec(backward=True, backward_excludes=("tiny_scale",)).for_backward()
    seen = set()

    @settings(max_examples=150, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(recipes(spec=spec, max_n=8))
    def draw(recipe):
        seen.add(recipe.scale)

    draw()
    assert "tiny" not in seen and {"default", "negative", "huge"} <= seen


@pytest.mark.parametrize("spec, digest", [
    (KernelSpec(), "1ef44fbbf46cbc24"),
    (KernelSpec(softcap=True, window=True, chunk=True, sinks=True, attn_mask=True), "858afed2be6f61d8"),
], ids=["plain", "softcap_window_chunk_sinks"])
def test_a_spec_without_alibi_or_a_bias_draws_the_recipes_it_drew_before_them(spec, digest):
    """Pinned: a kernel gets the case list of the same seed whatever features it does not take (saved recipes,
    corpora and sign-off lists stay valid): their fields hold one value, which the covering plan leaves out.
    Re-pinned when the plan stopped counting such fields (the sparse features were the first added since)."""
    import hashlib
    import json

    drawn = [r.as_dict() for r in draw_recipes(40, seed=5, max_n=64, spec=spec)]
    assert hashlib.sha256(json.dumps(drawn, sort_keys=True).encode()).hexdigest()[:16] == digest


def test_recipes_take_their_options_as_a_record_or_as_keywords():
    options = RecipeOptions(spec=NARROW, max_n=64, value_regimes=("ties", "flat"))
    assert draw_recipes(12, options, seed=4) == draw_recipes(12, seed=4, spec=NARROW, max_n=64,
                                                             value_regimes=("ties", "flat"))
    assert recipe_pools(options, max_n=16) == recipe_pools(spec=NARROW, value_regimes=("ties", "flat"))
    with pytest.raises(TypeError, match="max_m"):
        recipes(max_m=64)


MLA = KernelSpec(max_head_dim=1024, dv_equals_d=False, gqa=True)


def test_head_dim_pairs_fix_d_and_dv():
    from hypothesis import HealthCheck

    seen = set()

    @settings(max_examples=120, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(shapes(spec=MLA, head_dims=[[576, 512], [192, 128], 64, 96]))
    def draw(s):
        seen.add((s.head_dim, s.head_dim_v))

    draw()
    assert {(576, 512), (192, 128)} <= seen
    assert seen <= {(576, 512), (192, 128), (64, 64), (64, 96), (96, 64), (96, 96)}
    assert seen & {(64, 96), (96, 64)}  # a single dim still draws its Dv from the other single dims


@pytest.mark.parametrize("spec, head_dims, words", [
    (MLA.replace(dv_equals_d=True), [[576, 512]], r"Dv=512 differs from D=576 \(dv_equals_d=True\)"),
    (KernelSpec(dv_equals_d=False), [[576, 512], 64], "head dim 576 outside min_head_dim=1 to max_head_dim=256"),
    (MLA.replace(head_dims=(64, 576), max_head_dim=576), [[192, 128]], "head dim 192 not among its head_dims"),
    (MLA.replace(head_dims=(576,), max_head_dim=576), [[576, 640]], "Dv=640 above max_head_dim=576"),
])
def test_a_pair_the_spec_forbids_is_named(spec, head_dims, words):
    with pytest.raises(InvalidArgument, match=rf"^head_dims=\[\d+, \d+\]: the kernel's spec forbids this pair: {words}"):
        shapes(spec=spec, head_dims=head_dims)


@pytest.mark.parametrize("head_dims, words", [
    ([[576, 512, 64]], r"^head_dims=\[576, 512, 64\]: a pair holds two head dims"),
    ([[576, 0]], r"^head_dims=0: expected a head dim, from 1 to 1024"),
    ([2048], r"^head_dims=2048: expected a head dim or a pair \[D, Dv\], from 1 to 1024"),
    (["64"], r"^head_dims='64': expected a head dim or a pair"),
])
def test_malformed_head_dims_are_named(head_dims, words):
    with pytest.raises(InvalidArgument, match=words):
        shapes(spec=MLA, head_dims=head_dims)


def test_single_head_dims_the_spec_lacks_are_left_out_beside_a_pair():
    drawn = draw_recipes(12, seed=0, spec=MLA.replace(head_dims=(576,), max_head_dim=576), max_n=8,
                         head_dims=[[576, 512], 64])
    assert {(r.shapes.head_dim, r.shapes.head_dim_v) for r in drawn} == {(576, 512)}


@pytest.mark.parametrize("preset, digest", [("smoke", "e6b34f4200c76569"), ("adversarial", "9446013922015918")])
def test_presets_without_pairs_draw_the_recipes_they_drew_before_pairs(preset, digest):
    """Pinned at the commit before head-dim pairs (a list of single dims, or none, draws as it did), and pinned
    again when the covering plan stopped counting one-value fields."""
    import hashlib
    import json

    from flashcheck.inputs.presets import load_preset

    spec = KernelSpec(dv_equals_d=False, gqa=True, max_head_dim=192)
    drawn = [r.as_dict() for r in draw_recipes(30, seed=5, spec=spec, **load_preset(preset).strategy_options())]
    assert hashlib.sha256(json.dumps(drawn, sort_keys=True, default=str).encode()).hexdigest()[:16] == digest
