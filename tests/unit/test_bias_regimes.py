"""ALiBi slopes and attn_bias: each regime draws what it names, drawn cases are ones the kernel's spec takes,
recipes rebuild them exactly, and saved cases keep every bit of their bias."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings

from flashcheck import AttentionCase, CaseFormatError, InvalidArgument, KernelSpec, Variant
from flashcheck.contract.validation import Shapes
from flashcheck.features.variant import unsupported_variant
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes, recipe_pools, recipes
from flashcheck.features.attn_bias import BIAS_LIMIT, WIDE_BIASES
from flashcheck.inputs.variant_regimes import VARIANT_REGIMES, make_variant

SLOPES, BIASES = VARIANT_REGIMES["alibi_slopes"], VARIANT_REGIMES["attn_bias"]
S = Shapes(2, 4, 2, 9, 13, 16, 16)
BIASED = KernelSpec(alibi="symmetric", attn_bias=True, attn_mask=True, causal=("none", "bottom_right"))
CAPPED = KernelSpec(dtypes=("fp16", "bf16"), alibi="linear", attn_bias=True, fp32_bias=True, softcap=True,
                    bias_order="bias_first")


def _bias(name: str, dtype="fp16", shapes=S) -> torch.Tensor:
    return make_variant({"attn_bias": name}, shapes=shapes, seed=1, drawing={"bias_dtype": dtype}).attn_bias


def _full(bias: torch.Tensor, s=S) -> torch.Tensor:
    return torch.broadcast_to(bias, (s.batch, s.heads_q, s.n_q, s.n_k))


def test_the_slope_regimes():
    slopes = {name: make_variant({"alibi_slopes": name}, shapes=S, seed=0).alibi_slopes for name in list(SLOPES)[1:]}
    assert list(SLOPES)[0] == "none" and all(t.dtype == torch.float32 for t in slopes.values())
    assert torch.equal(slopes["geometric"], torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]))
    assert torch.equal(slopes["negative"], -slopes["geometric"])
    assert slopes["per_batch"].shape == (2, 4) and tuple(slopes["steep"].shape) == (4,)
    assert bool((slopes["steep"] >= 1).all() and (slopes["steep"] <= 8).all())
    assert bool((slopes["tiny"] < 3e-4).all() and (slopes["tiny"] > 0).all())


@pytest.mark.parametrize("name", [n for n in BIASES if n != "none"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_every_bias_regime_broadcasts_and_is_in_its_dtype(name, dtype):
    if name in WIDE_BIASES and dtype == "fp16":
        with pytest.raises(InvalidArgument, match=f"attn_bias regime='{name}'.*fp16's range.*fp32_bias=True"):
            _bias(name, dtype)
        return
    bias = _bias(name, dtype)
    assert bias.dtype == {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    assert _full(bias).shape == (2, 4, 9, 13) and not bool(torch.isnan(bias).any())


def test_the_broadcast_shapes():
    shapes = {name: tuple(_bias(name).shape) for name in ("random", "keys", "per_batch", "per_row", "matrix")}
    assert shapes == {"random": (2, 4, 9, 13), "keys": (1, 1, 1, 13), "per_batch": (2, 1, 9, 13),
                      "per_row": (1, 4, 9, 1), "matrix": (9, 13)}


def test_the_bias_values():
    rows = lambda b: _full(b).flatten(0, 2)  # noqa: E731 - one row per query of every head
    hidden = rows(_bias("hidden_keys"))
    assert 0 < int(hidden.eq(-math.inf).sum()) < hidden.numel()
    assert rows(_bias("hidden_rows")).eq(-math.inf).all(-1).any()
    lowest = _bias("lowest")
    assert lowest.eq(-65504).any() and rows(lowest).eq(-65504).all(-1).any() and not lowest.isinf().any()
    assert rows(_bias("below_5e4")).lt(-5e4).all(-1).any() and _bias("below_5e4").isfinite().all()
    for dtype in ("bf16", "fp32"):
        assert rows(_bias("below_1e30", dtype)).float().lt(-1e30).all(-1).any()
    dominant = _bias("dominant").abs().float()
    assert bool((dominant >= 1e3).all() and (dominant <= 1e4).all())
    constant = _bias("row_constant")
    assert constant.shape == (2, 4, 9, 13) and torch.equal(constant, constant[..., :1].expand_as(constant))


def test_a_row_hidden_by_the_bias_is_an_empty_row():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 16, generator=gen).half() for h, n in ((4, 9), (2, 13), (2, 13)))
    variant = make_variant({"attn_bias": "hidden_rows"}, shapes=S, seed=1, drawing={"bias_dtype": "fp16"})
    case = AttentionCase.create(q, k, v, scale=0.25, variant=variant)
    assert torch.equal(case.empty_rows(), _full(variant.attn_bias).eq(-math.inf).all(-1))
    assert case.empty_rows().any() and len(case.describe()) < 200


def test_long_rows_keep_the_bias_small():
    long = Shapes(1, 2, 2, 16384, 16384, 64, 64)
    for name in [n for n in BIASES if n != "none"]:
        bias = _bias(name, "bf16", long)
        assert bias.numel() <= BIAS_LIMIT and _full(bias, long).shape == (1, 2, 16384, 16384), name


def _drawn(spec, count=120):
    return draw_recipes(count, seed=0, max_n=64, spec=spec)


@pytest.mark.parametrize("spec", [BIASED, CAPPED], ids=["symmetric", "linear_capped_fp32_bias"])
def test_a_spec_with_alibi_and_a_bias_draws_every_regime_as_it_takes_them(spec):
    drawn = _drawn(spec)
    assert {r.alibi_slopes for r in drawn} == set(SLOPES) and {r.attn_bias for r in drawn} == set(BIASES)
    for recipe in drawn:
        case = recipe.build()
        assert unsupported_variant(case.variant, spec, case.torch_dtype) is None, recipe
        assert Recipe.from_dict(json.loads(json.dumps(recipe.as_dict()))).build().equal_bits(case)
        if recipe.alibi_slopes != "none":
            assert case.variant.alibi == spec.alibi == recipe.alibi_mode
    if spec.fp32_bias:
        dtypes = {(r.dtype, r.bias_dtype) for r in drawn if r.attn_bias != "none"}
        assert {("fp16", "fp32"), ("fp16", "fp16"), ("bf16", "fp32")} <= dtypes
        assert {r.bias_order for r in drawn if r.softcap != "none" and r.attn_bias != "none"} == {"bias_first"}


@settings(max_examples=30, deadline=None)
@given(recipe=recipes(spec=CAPPED, max_n=40))
def test_biased_recipes_rebuild_bit_identical_cases(recipe):
    assert Recipe.from_dict(recipe.as_dict()).build().equal_bits(recipe.build())
    if recipe.attn_bias in WIDE_BIASES:
        assert recipe.bias_dtype == "fp32"


def test_an_fp16_kernel_without_fp32_bias_is_not_drawn_biases_past_fp16():
    spec = KernelSpec(dtypes=("fp16",), attn_bias=True)
    assert not set(WIDE_BIASES) & set(recipe_pools(spec=spec)["attn_bias"])
    assert "below_1e30" in recipe_pools(spec=spec.replace(fp32_bias=True))["attn_bias"]
    mixed = [r for r in _drawn(KernelSpec(attn_bias=True), 60) if r.attn_bias in WIDE_BIASES]
    assert mixed and all(r.dtype != "fp16" and r.bias_dtype == r.dtype for r in mixed)


def test_recipes_saved_before_the_bias_fields_load():
    old = {"shapes": vars(S), "dtype": "fp16", "values": "ties", "mask": "none", "causal": "none",
           "scale": "default", "layout": "contiguous", "seed": 3, "sinks": "moderate"}
    recipe = Recipe.from_dict(old)
    assert recipe.as_dict() == old and (recipe.alibi_mode, recipe.bias_order, recipe.bias_dtype) == (None,) * 3


def _case(bias, dtype=torch.float16, **variant):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, n, 8, generator=gen).to(dtype) for h, n in ((4, 9), (2, 13), (2, 13)))
    return AttentionCase.create(q, k, v, scale=0.3, variant=Variant(attn_bias=bias, **variant))


@pytest.mark.parametrize("dtype,bias_dtype", [(torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
                                              (torch.float16, torch.float32)])
def test_a_biased_case_saves_and_loads_bit_for_bit(tmp_path, dtype, bias_dtype):
    bias = torch.randn(4, 9, 13).to(bias_dtype)
    bias[0, 0] = -math.inf
    bias[1, :, 3] = -65504
    bias[2, 1, 1] = -0.0
    case = _case(bias, dtype, alibi_slopes=torch.tensor([[0.5, -0.25, 1e-4, 8.0]] * 2), alibi="linear",
                 softcap=20.0, bias_order="bias_first")
    _, json_path = case.save(tmp_path / "c")
    loaded = AttentionCase.load(json_path)
    assert loaded.equal_bits(case) and loaded.variant.attn_bias.dtype == bias_dtype
    assert (loaded.variant.alibi, loaded.variant.bias_order) == ("linear", "bias_first")
    meta = json.loads(json_path.read_text())
    assert meta["format_version"] == 2 and meta["variant"]["alibi"] == "linear"
    assert meta["attn_bias"] == {"shape": [4, 9, 13], "dtype": str(bias_dtype).replace("torch.float", "fp")
                                 .replace("torch.bfloat16", "bf16")}
    assert meta["alibi_slopes"] == {"shape": [2, 4]}
    assert not loaded.equal_bits(_case(bias.clone().fill_(1.0), dtype))


def test_a_saved_bias_whose_dtype_disagrees_with_its_json_is_refused(tmp_path):
    _, json_path = _case(torch.zeros(13).half()).save(tmp_path / "c")
    meta = json.loads(json_path.read_text())
    meta["attn_bias"]["dtype"] = "fp32"
    json_path.write_text(json.dumps(meta))
    with pytest.raises(CaseFormatError, match="attn_bias is stored as float16; a fp32 attn_bias stores float32"):
        AttentionCase.load(json_path)
    meta["attn_bias"]["dtype"] = "fp64"
    json_path.write_text(json.dumps(meta))
    with pytest.raises(CaseFormatError, match="'attn_bias' has dtype 'fp64'"):
        AttentionCase.load(json_path)


def test_a_row_the_bias_hides_is_empty_unless_a_finite_sink_takes_it():
    bias = torch.zeros(9, 13, dtype=torch.float16)
    bias[2] = -math.inf
    empty = _case(bias).empty_rows()
    assert empty[..., 2].all() and int(empty.sum()) == 2 * 4
    sinks = torch.tensor([0.5, -math.inf, 1.0, -math.inf])
    assert torch.equal(_case(bias, sinks=sinks).empty_rows()[:, :, 2], sinks.isinf().expand(2, 4))
