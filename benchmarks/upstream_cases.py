"""The saved cases of upstream defects that no campaign saved, rebuilt from their shrunk descriptions
(reports/results.md, "Defects found in PyTorch and Triton") and written with flashcheck's own case format
into reports/upstream-2026-12-04/cases/, for `flashcheck repro` (benchmarks/upstream_repros.py).

Each builder is the input of the test that keeps the defect visible (tests/gpu/test_sdpa_gpu.py,
tests/unit/test_sdpa_adapters.py, tests/unit/test_sdpa_backward_defects.py) or, for a saved case whose
arrays were not kept, the recipe its JSON records.

Usage (repository root): PYTHONPATH=src python benchmarks/upstream_cases.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from flashcheck import AttentionCase
from flashcheck.inputs.recipe import Recipe
from flashcheck.judge.backward import backward_case

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "upstream-2026-12-04" / "cases"
# Only its JSON was committed (no .npz); its recipe rebuilds the arrays.
FLEX_D178 = ROOT / "reports/signoff-h200-2026-12-01-run1/corpus/torch-flex-forward/torch-flex-crash-shrunk-118d0bd857.json"


def _shrunk(causal: str, scale: str, layout: str, n_q: int, n_k: int, *, seed: int = 0) -> AttentionCase:
    """A case as the campaigns shrank them: B = H = 1, D = Dv = 16, fp16, random values."""
    shapes = {"batch": 1, "heads_q": 1, "heads_kv": 1, "n_q": n_q, "n_k": n_k, "head_dim": 16, "head_dim_v": 16}
    return Recipe.from_dict({"shapes": shapes, "dtype": "fp16", "values": "random", "mask": "none",
                             "causal": causal, "scale": scale, "layout": layout, "seed": seed}).build()


def _dp_overflow() -> AttentionCase:
    """CPU flash backward, fp16: Nq = 65, Nk = 3, |V| = 68 and dO near 256, so dP = dO . V passes 65,504."""
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(1, 1, n, 128, generator=g).mul(0.3).half() for n in (65, 3))
    v = (torch.randn(1, 1, 3, 128, generator=g).sign() * 68).half()
    case = AttentionCase.create(q, k, v, scale=128 ** -0.5, causal="top_left")
    return backward_case(case, upstream="huge", seed=0)


def _dv_growth() -> AttentionCase:
    """CPU flash backward, bf16: 4,096 queries on one key, dO along O; dV sums every row (1.4x the budget
    here, 5x at 16,384 rows: a larger case only makes the script larger)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 4096, 16, generator=g).bfloat16()
    k, v = (torch.randn(1, 1, 1, 16, generator=g).bfloat16() for _ in range(2))
    return backward_case(AttentionCase.create(q, k, v, scale=0.25), upstream="aligned", seed=0)


def _from_recipe(path: Path, **shapes) -> AttentionCase:
    """The case a saved JSON's recipe draws, with ``shapes`` changed (fewer batch entries and heads)."""
    recipe = json.loads(path.read_text())["provenance"]["recipe"]
    return Recipe.from_dict({**recipe, "shapes": {**recipe["shapes"], **shapes}}).build()


# stem -> (kernel, builder, what it is)
BUILDERS = {
    "torch-flash-negative-scale": ("torch:flash", lambda: _shrunk("none", "negative", "contiguous", 1, 1),
                                   "CUDA flash: NaN for a negative scale"),
    "torch-flash-cpu-negative-scale-causal": (
        "torch:flash", lambda: _shrunk("top_left", "negative", "contiguous", 1, 2),
        "CPU flash: NaN for a negative scale with causal masking"),
    "torch-efficient-lower-right-more-queries": (
        "torch:efficient", lambda: _shrunk("bottom_right", "default", "contiguous", 3, 2),
        "efficient: causal_lower_right with Nq > Nk"),
    "torch-efficient-stride0-kv-heads": ("torch:efficient", lambda: _shrunk("top_left", "default", "expanded", 1, 2),
                                         "efficient: K/V heads as stride-0 views"),
    "torch-flash-cpu-backward-dp-overflow": ("torch:flash", _dp_overflow,
                                             "CPU flash backward, fp16: dP = dO . V overflows"),
    "torch-flash-cpu-backward-dv-growth": ("torch:flash", _dv_growth,
                                           "CPU flash backward, bf16: dV's error grows with Nq"),
    # The recipe's own shapes (B = 2, H = 6): with B = H = 1 the H200 ran the same head dims and passed.
    "torch-flex-fp32-d178-shared-memory": ("torch:flex", lambda: _from_recipe(FLEX_D178),
                                           "flex, fp32, D = 178: no Triton config fits shared memory"),
}


def build(out: Path = OUT) -> list[Path]:
    """Write every builder's case under ``out``; returns the JSON paths."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, (kernel, make, what) in BUILDERS.items():
        case = make()
        marks = {"kernel": kernel, "kernel_source": kernel, "strategy": "hand-built", "seed": None, "notes": what}
        written.append(case.with_provenance({**case.provenance, **marks}).save(out / stem)[1])
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"default: {OUT.relative_to(ROOT)}")
    for path in build(parser.parse_args().out):
        print(path)


if __name__ == "__main__":
    main()
