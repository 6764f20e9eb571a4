"""Campaign presets: the built-in ones load, user files are validated key by key."""

from __future__ import annotations

import pytest

from flashcheck import InvalidArgument
from flashcheck.inputs.presets import builtin_presets, load_preset


def test_builtin_presets_load():
    names = set(builtin_presets())
    assert {"smoke", "adversarial", "long-context", "signoff"} <= names
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
