"""Saved cases keep their bytes: a case of each format version (plain; every variant feature; serving cases, paged
and varlen, over variant bases; fp8 inputs with descales), saved with the zip's clock pinned, gives the committed
files in ``saved_cases/`` byte for byte, and each committed pair loads and saves again unchanged. A recipe with
every feature keeps its saved dict, its text and the case it builds.

``python -m tests.unit.test_saved_bytes`` writes the committed files again (only for a deliberate format change).
"""

from __future__ import annotations

import json
import math
import types
import zipfile
from pathlib import Path

import pytest
import torch

from flashcheck import Variant
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.serving import ServingCase

SAVED = Path(__file__).parent / "saved_cases"
VERSIONS = {"flashcheck": "0.0.0", "torch": "0.0.0", "numpy": "0.0.0", "triton": None}
# Every variant feature at once, in the flat form recipes have always been saved in.
RECIPE = {"shapes": {"batch": 2, "heads_q": 2, "heads_kv": 1, "n_q": 5, "n_k": 9, "head_dim": 16, "head_dim_v": 16},
          "dtype": "bf16", "values": "peaked", "mask": "random", "causal": "bottom_right", "scale": "default",
          "layout": "contiguous", "seed": 7, "softcap": "cap_30", "alibi_slopes": "per_batch",
          "attn_bias": "per_row", "window": "band", "chunk": "odd", "sinks": "mixed", "alibi_mode": "linear",
          "bias_order": "bias_first", "bias_dtype": "fp32"}


def _numbers(shape, dtype, offset=0) -> torch.Tensor:
    """Exact small numbers (multiples of 1/4 in [-2, 2]) that no library version rounds differently."""
    n = math.prod(shape)
    return (((torch.arange(n) * 7 + offset) % 17 - 8) / 4).reshape(shape).to(dtype)


def _qkv(b, hq, hkv, nq, nk, d, dtype):
    return (_numbers((b, hq, nq, d), dtype), _numbers((b, hkv, nk, d), dtype, 3), _numbers((b, hkv, nk, d), dtype, 5))


def _provenance(name: str) -> dict:
    return {"seed": 3, "strategy": name, "kernel": "torch:math", "versions": VERSIONS}


def _plain():
    q, k, v = _qkv(2, 2, 1, 3, 5, 8, torch.float16)
    mask = torch.arange(15).reshape(1, 1, 3, 5) % 3 != 0
    return AttentionCase.create(q, k, v, scale=0.3, causal="top_left", attn_mask=mask, provenance=_provenance("plain"))


def _every_feature():
    q, k, v = _qkv(2, 4, 2, 5, 9, 8, torch.bfloat16)
    variant = Variant(softcap=30.0, alibi_slopes=_numbers((2, 4), torch.float32, 1) + 3,
                      attn_bias=_numbers((2, 1, 5, 9), torch.float32, 2), window=(4, 1), chunk=3,
                      sinks=torch.tensor([-math.inf, 0.5, -1.25, 2.0]), alibi="linear", bias_order="bias_first")
    return AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right", layout="transposed",
                                provenance=_provenance("every_feature"), variant=variant)


def _paged():
    q, k, v = _qkv(3, 2, 2, 2, 7, 8, torch.float16)
    variant = Variant(softcap=50.0, alibi_slopes=_numbers((3, 2), torch.float32) + 3, window=(-1, 2),
                      sinks=torch.tensor([1.5, -0.25]))
    base = AttentionCase.create(q, k, v, scale=0.5, provenance=_provenance("paged"), variant=variant)
    table = torch.tensor([[4, 1], [0, 5], [2, 3]], dtype=torch.int32)
    return ServingCase(base, "paged", [2, 2, 2], [7, 3, 4], page_size=4, block_table=table, num_blocks=6, poison="nan")


def _varlen():
    q, k, v = _qkv(2, 2, 1, 4, 6, 8, torch.bfloat16)
    variant = Variant(alibi_slopes=_numbers((2,), torch.float32) + 3, chunk=2)
    base = AttentionCase.create(q, k, v, scale=0.5, causal="bottom_right", provenance=_provenance("varlen"),
                                variant=variant)
    return ServingCase(base, "varlen", [4, 1], [6, 2], max_seqlen_pad=3, k_slack=[0, 2])


def _fp8():
    q, k, v = (t.to(torch.float8_e4m3fn) for t in _qkv(1, 2, 1, 3, 4, 16, torch.float32))
    variant = Variant(softcap=30.0, attn_bias=_numbers((3, 4), torch.bfloat16), sinks=torch.tensor([0.0, -2.0]),
                      descales=torch.tensor([0.5, 0.25, 2.0]).view(3, 1, 1))
    return AttentionCase.create(q, k, v, scale=0.25, provenance=_provenance("fp8"), variant=variant)


CASES = {"plain": _plain, "every_feature": _every_feature, "paged": _paged, "varlen": _varlen, "fp8": _fp8}
VERSION = {"plain": 1, "every_feature": 2, "paged": 4, "varlen": 4, "fp8": 4}  # a serving case: the latest


def _save_pinned(case, stem: Path) -> tuple[bytes, bytes]:
    """The case's saved bytes with the zip entries' clock at 1980-01-01 (numpy stamps them with the time)."""
    clock = types.SimpleNamespace(time=lambda: 0.0, localtime=lambda seconds=None: (1980, 1, 1, 0, 0, 0, 1, 1, 0))
    real, zipfile.time = zipfile.time, clock
    try:
        npz_path, json_path = case.save(stem)
    finally:
        zipfile.time = real
    return npz_path.read_bytes(), json_path.read_bytes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_case_saves_the_committed_bytes(tmp_path, name):
    npz, text = _save_pinned(CASES[name](), tmp_path / name)
    assert json.loads(text)["format_version"] == VERSION[name]
    assert text == (SAVED / f"{name}.json").read_bytes()
    assert npz == (SAVED / f"{name}.npz").read_bytes()


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_committed_case_loads_and_saves_unchanged(tmp_path, name):
    case = load_case(SAVED / f"{name}.json")
    assert case.equal_bits(CASES[name]())
    npz, text = _save_pinned(case, tmp_path / name)
    assert (npz, text) == ((SAVED / f"{name}.npz").read_bytes(), (SAVED / f"{name}.json").read_bytes())


def test_a_recipe_with_every_feature_keeps_its_dict_and_its_text():
    recipe = Recipe.from_dict(RECIPE)
    assert json.dumps(recipe.as_dict()) == json.dumps(RECIPE)
    assert Recipe.from_dict(recipe.as_dict()) == recipe
    assert recipe.regime == ("peaked/random/softcap=cap_30/alibi_slopes=per_batch/attn_bias=per_row/window=band"
                             "/chunk=odd/sinks=mixed")
    assert repr(recipe) == (SAVED / "recipe.txt").read_text().strip()
    case = recipe.build()
    assert json.dumps(case.provenance["recipe"]) == json.dumps(RECIPE)
    assert case.variant.describe() == (SAVED / "recipe_variant.txt").read_text().strip()


def _write() -> None:
    SAVED.mkdir(exist_ok=True)
    for name, make in CASES.items():
        _save_pinned(make(), SAVED / name)
    recipe = Recipe.from_dict(RECIPE)
    (SAVED / "recipe.txt").write_text(repr(recipe) + "\n")
    (SAVED / "recipe_variant.txt").write_text(recipe.build().variant.describe() + "\n")


if __name__ == "__main__":
    _write()
