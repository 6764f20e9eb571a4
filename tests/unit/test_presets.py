"""Campaign presets: the built-in ones load, user files are validated key by key."""

from __future__ import annotations

import pytest

from flashcheck import InvalidArgument
from flashcheck.inputs.presets import builtin_presets, load_preset
from flashcheck.inputs.recipe_draws import draw_recipes, recipe_pools
from flashcheck.kernels.registry import resolve_kernel


def test_builtin_presets_load():
    names = set(builtin_presets())
    assert {"smoke", "adversarial", "long-context", "signoff", "serving", "mla", "sparse"} <= names
    for name in names:
        preset = load_preset(name)
        assert preset.description and preset.max_examples >= 1 and preset.min_n <= preset.max_n


def test_user_preset_by_path(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('max_examples = 7\ndtypes = ["bf16"]\nvalue_regimes = ["ties"]\nmax_n = 33\n')
    preset = load_preset(path)
    assert preset.name == "mine" and preset.max_examples == 7 and preset.dtypes == ("bf16",)
    assert preset.strategy_options()["value_regimes"] == ("ties",)
    assert preset.jobs == 1
    path.write_text("jobs = 3\n")
    assert load_preset(path).jobs == 3


@pytest.mark.parametrize("text, words", [
    ("max_exampels = 3\n", "unknown preset key"),
    ('max_examples = "3"\n', "wrong kind of value"),
    ("dtypes = \"fp16\"\n", "expected a list"),
    ("max_n = 0\n", "must be at least 1"),
    ("jobs = 0\n", "must be at least 1"),
    ("jobs = 1.5\n", "wrong kind of value"),
    ("max_n = [\n", "cannot be read as TOML"),
    ("max_queries = 0\n", "max_queries=0: must be at least 1"),
    ('max_total_tokens = "big"\n', "max_total_tokens='big': wrong kind of value"),
    ("max_n = 1000\nmax_total_tokens = 1500\n", "max_total_tokens=1500: below one sequence of 2000 tokens"),
    ("max_n = 1000\nmax_queries = 16\nmax_total_tokens = 1015\n", "max_total_tokens=1015: below one sequence of 1016"),
    ("large_tensors = 1\n", "large_tensors=1: wrong kind of value.*true or false"),
    ("max_decode_n = true\n", "max_decode_n=True: wrong kind of value.*an integer"),
    ("min_n = 4096\nmax_decode_n = 1024\n", "max_decode_n=1024: below min_n"),
    ('head_dims = ["64"]\n', r"head_dims=\['64'\]: expected a list.*head dims D or pairs \[D, Dv\]"),
    ("head_dims = [[576]]\n", r"^bad.toml: head_dims=\[576\]: a pair holds two head dims"),
    ("head_dims = [64, [576, 2048]]\n", r"^bad.toml: head_dims=2048: expected a head dim, from 1 to 1024"),
])
def test_bad_user_presets_are_refused_by_key(tmp_path, text, words):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InvalidArgument, match=words):
        load_preset(path)


def test_unknown_preset_name():
    with pytest.raises(InvalidArgument, match="^preset='nonesuch'"):
        load_preset("nonesuch")


def test_a_preset_names_the_variant_features_it_draws(tmp_path):
    from flashcheck import KernelSpec
    from flashcheck.inputs.recipe_draws import recipe_pools

    path = tmp_path / "biased.toml"
    path.write_text('variants = ["attn_bias", "alibi_slopes"]\n')
    options = {k: v for k, v in load_preset(path).strategy_options().items() if k == "variants"}
    spec = KernelSpec(alibi="linear", attn_bias=True, softcap=True)
    pools = recipe_pools(spec=spec, **options)
    assert len(pools["attn_bias"]) > 1 and len(pools["alibi_slopes"]) > 1 and pools["softcap"] == ["none"]
    path.write_text('variants = ["alibi"]\n')
    with pytest.raises(InvalidArgument, match=r"^biased.toml: variants=\['alibi'\].*alibi_slopes for ALiBi"):
        load_preset(path)


def test_a_preset_names_head_dim_pairs(tmp_path):
    from flashcheck.contract.head_dims import HeadDimPair

    path = tmp_path / "mla.toml"
    path.write_text("head_dims = [[576, 512], [192, 128], 64]\n")
    assert load_preset(path).strategy_options()["head_dims"] == (HeadDimPair(576, 512), HeadDimPair(192, 128), 64)


def test_a_property_test_keeps_the_pairs_and_the_single_dims_its_kernel_takes(tmp_path):
    from flashcheck import KernelSpec
    from flashcheck.contract.head_dims import HeadDimPair
    from flashcheck.testing.property_test import _strategy_options

    path = tmp_path / "mla.toml"
    path.write_text("head_dims = [[576, 512], 64, 2]\n")
    preset = load_preset(path)
    mla = KernelSpec(head_dims=(64, 576), max_head_dim=576, dv_equals_d=False)
    assert _strategy_options(preset, mla)["head_dims"] == [HeadDimPair(576, 512), 64]
    with pytest.raises(InvalidArgument, match=r"^head_dims=\[576, 512\]: the kernel's spec forbids this pair"):
        _strategy_options(preset, KernelSpec(head_dims=(64, 128)))


@pytest.mark.parametrize("name", ["torch:mla", "torch:mla-paged"])
def test_the_mla_preset_draws_deepseek_and_kimi_decode_shapes(name):
    preset = load_preset("mla")
    assert preset.dtypes == ("fp16", "bf16") and (preset.min_n, preset.max_n) == (1024, 131072)
    spec = resolve_kernel(name, device="cpu").spec
    drawn = draw_recipes(16, spec=spec, seed=1, **preset.strategy_options())
    for recipe in drawn:
        s = recipe.shapes
        assert (s.head_dim, s.head_dim_v, s.heads_kv) == (576, 512, 1) and 1 <= s.heads_q <= 128
        assert 1 <= s.n_q <= 4 and 1024 <= s.n_k <= 131072 and s.batch * (s.n_q + s.n_k) <= 524288
    assert {r.form_values for r in drawn} == {"none", "heavy_rope", "rope_dominant", "latent_dominant",
                                               "cancelling_parts", "huge_rope_logits"}
    assert max(r.shapes.heads_q for r in drawn) > 64 and max(r.shapes.n_k for r in drawn) > 65536
    if spec.form == "paged":
        assert {r.pages for r in drawn} == {"1", "16", "64"}


def test_the_mla_preset_stops_a_kernel_without_mla_at_its_head_dims():
    spec = resolve_kernel("torch:math", device="cpu").spec
    with pytest.raises(InvalidArgument) as raised:
        draw_recipes(2, spec=spec, seed=0, **load_preset("mla").strategy_options())
    assert raised.value.argument == "head_dims" and "[576, 512]" in str(raised.value) and "forbids" in str(raised.value)


def test_a_preset_names_the_form_value_regimes_it_draws(tmp_path):
    spec = resolve_kernel("torch:mla", device="cpu").spec
    path = tmp_path / "rope.toml"
    path.write_text('form_values = ["rope_dominant"]\n')
    assert recipe_pools(spec=spec, **load_preset(path).strategy_options())["form_values"] == ["none", "rope_dominant"]
    assert "form_values" not in load_preset("serving").strategy_options()  # left out: a campaign's key as before
    path.write_text('form_values = ["rope_heavy"]\n')
    with pytest.raises(InvalidArgument) as raised:
        recipe_pools(spec=spec, **load_preset(path).strategy_options())
    assert raised.value.argument == "form_values" and "rope_heavy" in str(raised.value)
    path.write_text('form_values = "rope_dominant"\n')
    with pytest.raises(InvalidArgument, match="form_values"):
        load_preset(path)
