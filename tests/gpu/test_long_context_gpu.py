"""Long rows and tensors past 2^31 elements on a CUDA GPU: flashcheck:triton's planted bugs of long contexts
show there and nowhere shorter (there they give the correct kernel's bits), and the correct kernel passes the
same cases.

Each verdict on a large case is reached in a process of its own: an offset that wraps may point outside every
allocation, which leaves the process's CUDA context unusable for the tests after it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import INT32_ELEMENTS, past_int32
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

ROOT = Path(__file__).resolve().parents[2]
TILES = dict(block_m=64, block_n=64)
_JUDGE = """
import json, sys
import flashcheck
from flashcheck.inputs.recipe import Recipe
from flashcheck.kernels.registry import resolve_kernel
case = Recipe.from_dict(json.loads(sys.argv[2])).build()
verdict = flashcheck.check(resolve_kernel(sys.argv[1], device="cuda"), case, device="cuda", properties=())
print(json.dumps({"status": verdict.status, "kinds": sorted({f.kind for f in verdict.findings}),
                  "max_ratio": verdict.max_ratio}))
"""


def _judged_apart(kernel: str, recipe: Recipe) -> dict:
    run = subprocess.run([sys.executable, "-c", _JUDGE, kernel, json.dumps(recipe.as_dict())], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def _kernels(mutant: str):
    from flashcheck.kernels.triton.forward import make_kernel, on_device
    from flashcheck.kernels.triton.mutants import load_mutant

    return on_device(make_kernel(**TILES), "cuda"), on_device(load_mutant(mutant, **TILES), "cuda")


def _same_bits(mutant: str, recipe: Recipe) -> None:
    correct, planted = _kernels(mutant)
    case = recipe.build()
    q, k, v, _ = case.to_device("cuda")
    a = correct(q, k, v, scale=case.scale, causal=case.causal)
    b = planted(q, k, v, scale=case.scale, causal=case.causal)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]), recipe.shapes


def test_int32_offsets_are_caught_past_two_to_the_31_elements():
    shapes = past_int32(Shapes(1, 2, 2, 16, 65536, 128, 128))
    assert shapes.batch * 2 * 65536 * 128 > INT32_ELEMENTS
    recipe = Recipe(shapes=shapes, dtype="bf16", seed=5, elements="past_int32")
    assert _judged_apart("flashcheck:triton[block_m=64,block_n=64]", recipe)["status"] == "PASS"
    assert _judged_apart("flashcheck:triton~int32_offsets[block_m=64,block_n=64]", recipe)["status"] == "BUG"


@pytest.mark.parametrize("shapes", [Shapes(3, 4, 2, 129, 65, 64, 64), Shapes(2, 8, 1, 16, 65536, 128, 128)],
                         ids=["short", "long-below-int32"])
def test_int32_offsets_give_the_correct_bits_below_it(shapes):
    _same_bits("int32_offsets", Recipe(shapes=shapes, dtype="fp16", seed=2, causal="bottom_right"))


def test_the_key_position_in_fp16_is_caught_past_65536_keys():
    recipe = Recipe(shapes=Shapes(1, 2, 1, 4, 70001, 64, 64), dtype="fp16", seed=3)
    verdict = _judged_apart("flashcheck:triton~key_position_in_fp16[block_m=64,block_n=64]", recipe)
    assert verdict["status"] == "BUG" and "over_budget" in verdict["kinds"], verdict
    assert _judged_apart("flashcheck:triton[block_m=64,block_n=64]", recipe)["status"] == "PASS"


@pytest.mark.parametrize("n_k", [513, 65536])
def test_the_key_position_in_fp16_gives_the_correct_bits_up_to_65536_keys(n_k):
    _same_bits("key_position_in_fp16", Recipe(shapes=Shapes(1, 2, 1, 4, n_k, 64, 64), dtype="fp16", seed=3))
