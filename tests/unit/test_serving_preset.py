"""The serving preset: decode and chunked-prefill shapes against 1k to 128k keys in batches of 1 to 64 sequences,
each case within the preset's token cap; its sizes are validated by name, and a CPU campaign runs on a copy of it
with smaller lengths."""

from __future__ import annotations

import json
import tomllib

import pytest

from flashcheck import InvalidArgument
from flashcheck.cli import main
from flashcheck.inputs.presets import builtin_presets, load_preset
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.kernels.registry import resolve_kernel

SERVING = load_preset("serving")


def test_the_serving_preset_states_its_ranges():
    assert (SERVING.min_n, SERVING.max_n, SERVING.max_batch, SERVING.max_queries) == (1024, 131072, 64, 512)
    assert SERVING.max_total_tokens == 2**19 and set(SERVING.dtypes) == {"fp16", "bf16"}
    options = SERVING.strategy_options()
    assert options["max_total_tokens"] == 2**19 and options["max_queries"] == 512


@pytest.mark.parametrize("kernel, most_queries", [("torch:paged", 16), ("torch:varlen", 512)])
def test_its_recipes_fall_in_the_stated_ranges(kernel, most_queries):
    spec = resolve_kernel(kernel, device="cpu").spec
    drawn = draw_recipes(24, seed=3, spec=spec, dtypes=["fp16"], **SERVING.strategy_options())  # recipes only
    for r in drawn:
        s = r.shapes
        assert 1024 <= s.n_k <= 131072 and 1 <= s.n_q <= most_queries and 1 <= s.batch <= 64, s
        assert s.batch * (s.n_q + s.n_k) <= 2**19 and s.heads_q <= 8 and s.head_dim in (64, 128), s
    assert max(r.shapes.n_k for r in drawn) > 16384 and max(r.shapes.batch for r in drawn) > 8
    assert len({r.shapes.n_q for r in drawn}) > 3


def test_a_dense_kernel_gets_decode_shapes_under_the_cap():
    drawn = draw_recipes(12, seed=1, dtypes=["fp16"], **SERVING.strategy_options())
    assert all(r.shapes.n_q <= 512 and r.shapes.batch * (r.shapes.n_q + r.shapes.n_k) <= 2**19 for r in drawn)


def test_presets_without_the_new_sizes_draw_as_before():
    spec = resolve_kernel("torch:paged", device="cpu").spec
    smoke = load_preset("smoke").strategy_options()
    assert smoke["max_queries"] is None and smoke["max_total_tokens"] is None
    plain = {k: v for k, v in smoke.items() if k not in ("max_queries", "max_total_tokens")}
    assert draw_recipes(12, seed=4, spec=spec, **smoke) == draw_recipes(12, seed=4, spec=spec, **plain)


def test_the_strategies_refuse_a_cap_below_one_sequence():
    with pytest.raises(InvalidArgument, match="^max_total_tokens=100: below one sequence"):
        draw_recipes(1, max_n=64, max_queries=64, max_total_tokens=100)


def test_a_cpu_campaign_runs_on_the_serving_preset_at_smaller_lengths(tmp_path):
    data = tomllib.loads(builtin_presets()["serving"].read_text())
    data.update(max_n=2048, max_total_tokens=8192, head_dims=[64])  # the preset's shapes, 64 times fewer keys
    path, out = tmp_path / "serving-cpu.toml", tmp_path / "summary.json"
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in data.items()))
    code = main(["fuzz", "torch:paged", "--preset", str(path), "--max-examples", "3", "--seed", "1", "--device", "cpu",
                 "--no-progress", "--corpus", str(tmp_path / "corpus"), "--json", str(out)])
    summary = json.loads(out.read_text())
    assert code == 0 and summary["verdict"] == "PASS" and summary["cases"] == 3, summary["findings"]
