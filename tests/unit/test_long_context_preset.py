"""The long-context preset: chunked prefill against 16k to 128k keys, decode steps against up to 1M keys, and one
case in eight of fp16 and bf16 whose batch grows until a tensor passes 2^31 elements; the other presets draw as
before these sizes existed."""

from __future__ import annotations

import dataclasses

import torch

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.covering import shape_classes
from flashcheck.inputs.presets import load_preset
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs import sizes
from flashcheck.inputs.recipe_draws import INT32_ELEMENTS, draw_recipes, past_int32
from flashcheck.inputs.regimes import make_values
from flashcheck.inputs.sizes import drawing_bytes, drawn_by_entry, entry_seed
from flashcheck.kernels.registry import resolve_kernel

LONG = load_preset("long-context")


def _largest(s: Shapes) -> int:
    return s.batch * max(s.heads_q * s.n_q, s.heads_kv * s.n_k) * max(s.head_dim, s.head_dim_v)


def test_the_preset_states_its_ranges():
    assert (LONG.min_n, LONG.max_n, LONG.max_queries, LONG.max_decode_n) == (16384, 131072, 1024, 2**20)
    assert LONG.large_tensors and "sliding_window" not in LONG.mask_regimes


def test_its_recipes_are_chunks_decode_steps_and_tensors_past_int32():
    spec = resolve_kernel("torch:math", device="cpu").spec
    drawn = draw_recipes(80, seed=1, spec=spec, dtypes=["fp16", "bf16"], **LONG.strategy_options())
    steps = [r for r in drawn if r.shapes.n_k > 131072]
    assert steps and all(r.shapes.n_q <= 16 and r.shapes.n_k <= 2**20 for r in steps)
    assert all(16384 <= r.shapes.n_k and r.shapes.n_q <= 1024 for r in drawn)
    large = [r for r in drawn if r.elements == "past_int32"]
    assert 2 <= len(large) <= 30, len(large)  # one in eight
    for r in large:
        assert _last_entry_start(r.shapes) >= INT32_ELEMENTS and _largest(r.shapes) <= 3 * INT32_ELEMENTS, r.shapes
        assert "past_int32" in shape_classes(r.shapes) and r.regime.endswith("/elements=past_int32")
    assert not any("past_int32" in shape_classes(r.shapes) for r in drawn if r.elements == "none")


def _last_entry_start(s: Shapes) -> int:
    return _largest(s) // s.batch * (s.batch - 1)


def test_past_int32_grows_the_batch_until_its_last_entry_starts_past_two_to_the_31():
    s = past_int32(Shapes(1, 8, 2, 16, 65536, 128, 128))
    smaller = dataclasses.replace(s, batch=128)
    assert s.batch == 129 and _last_entry_start(s) >= INT32_ELEMENTS > _last_entry_start(smaller)
    chunk = past_int32(Shapes(1, 8, 1, 1024, 4096, 64, 64))  # here q is the larger tensor
    assert _last_entry_start(chunk) >= INT32_ELEMENTS and chunk.batch == INT32_ELEMENTS // (8 * 1024 * 64) + 1
    odd = past_int32(Shapes(1, 8, 8, 16, 784602, 64, 64))  # 6 entries would hold 2^31 elements, the 6th not past it
    assert odd.batch == 7 and _last_entry_start(odd) >= INT32_ELEMENTS


def test_fp32_and_fp8_cases_keep_their_drawn_size():
    spec = resolve_kernel("torch:math", device="cpu").spec
    drawn = draw_recipes(40, seed=2, spec=spec, dtypes=["fp32"], **LONG.strategy_options())
    assert all(r.elements == "none" and _largest(r.shapes) < INT32_ELEMENTS for r in drawn)


def test_a_recipe_past_int32_saves_and_loads_its_regime():
    recipe = Recipe(shapes=past_int32(Shapes(1, 1, 1, 1, 16384, 64, 64)), dtype="bf16", elements="past_int32")
    assert Recipe.from_dict(recipe.as_dict()) == recipe
    plain = Recipe(shapes=Shapes(1, 1, 1, 1, 16, 64, 64), dtype="bf16")
    assert "elements" not in plain.as_dict()  # recipes of before the regime are saved as they were


def test_presets_without_the_long_sizes_draw_as_before():
    adversarial = load_preset("adversarial").strategy_options()
    assert adversarial["max_decode_n"] is None and adversarial["large_tensors"] is False
    plain = {k: v for k, v in adversarial.items() if k not in ("max_decode_n", "large_tensors")}
    assert draw_recipes(16, seed=4, **adversarial) == draw_recipes(16, seed=4, **plain)


def test_no_case_holds_a_dense_rows_by_keys_array():
    assert "attn_bias" not in LONG.variants and set(LONG.mask_regimes) == {"none", "key_padding_right"}
    spec = resolve_kernel("torch:math", device="cpu").spec
    drawn = draw_recipes(40, seed=3, spec=spec, dtypes=["bf16"], **LONG.strategy_options())
    assert all(r.attn_bias == "none" for r in drawn) and any(r.variants for r in drawn)


def test_a_case_larger_than_the_hosts_memory_is_skipped_not_drawn(tmp_path, monkeypatch):
    import json

    from flashcheck.cli import main
    from flashcheck.inputs import sizes

    assert sizes.drawing_bytes(Shapes(1, 1, 1, 1, 1024, 64, 64)) == 4 * (64 + 2 * 65536) + 2 * 65536
    assert sizes.host_memory_problem(Shapes(1, 1, 1, 1, 16, 16, 16)) is None  # this host holds a small case
    monkeypatch.setattr(sizes, "available_host_bytes", lambda: 2**20)  # 1 MiB: every long case is too large
    out = tmp_path / "summary.json"
    code = main(["fuzz", "torch:math", "--device", "cpu", "--preset", "long-context", "--max-examples", "3",
                 "--seed", "1", "--no-isolation", "--corpus", str(tmp_path / "corpus"), "--json", str(out),
                 "--no-progress"])
    summary = json.loads(out.read_text())
    assert code == 3 and summary["verdict"] == "NO_CASES" and summary["skipped"]["oom"] == 3
    assert "GiB of host memory" in " ".join(summary["skipped_reasons"])


def test_a_case_past_the_lean_size_is_drawn_one_batch_entry_at_a_time(monkeypatch):
    s = Shapes(3, 2, 1, 4, 64, 16, 16)
    plain = make_values("growing_max", shapes=s, dtype=torch.float16, seed=5)
    monkeypatch.setattr(sizes, "LEAN_BYTES", 1000)  # this small case now counts as large
    assert drawn_by_entry(s) and not drawn_by_entry(dataclasses.replace(s, batch=1))
    lean = make_values("growing_max", shapes=s, dtype=torch.float16, seed=5)
    again = make_values("growing_max", shapes=s, dtype=torch.float16, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(lean, again))  # a function of the recipe
    assert not all(torch.equal(a, b) for a, b in zip(lean, plain))  # and not the whole case's generator
    one = dataclasses.replace(s, batch=1)
    for entry in range(s.batch):
        alone = make_values("growing_max", shapes=one, dtype=torch.float16, seed=entry_seed(5, entry))
        assert all(torch.equal(t[entry], u[0]) for t, u in zip(lean, alone))


def test_drawing_a_case_past_int32_takes_its_rounded_size_and_one_entry_of_float32():
    s = past_int32(Shapes(1, 8, 2, 16, 65536, 128, 128))
    rounded = 2 * (s.batch * 8 * 16 * 128 + 2 * s.batch * 2 * 65536 * 128)
    # 8.1 GiB of rounded values and 0.2 GiB more, where the float32 values of the whole case take 16 GiB
    assert drawn_by_entry(s) and rounded < drawing_bytes(s) < 1.05 * rounded
