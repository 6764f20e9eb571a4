"""Probe of PyTorch's jagged SDPA (torch:jagged) on its shrunk over-budget cases: the wrong elements beside the
exact values, two controls on the same numbers (the head dim zero-padded to a multiple of 8, the same attention
in real arithmetic; each sequence's query repeated), and a model of the order of operations: q and k each
multiplied by sqrt(scale), then q k^T, the softmax and P V, every step rounded to the inputs' dtype (PyTorch's
math composite without its upcast). "model: bit-identical" means the model gives the kernel's bits.
Usage (repository root): python reports/serving-2026-12-02/jagged_probe.py [cuda|cpu]"""

from __future__ import annotations

import glob
import sys
from pathlib import Path

import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.casefile import load_case
from flashcheck.inputs.serving import ServingCase

HERE = Path(__file__).parent


def padded(case: ServingCase) -> ServingCase:
    base, pad = case.base, -case.shapes.head_dim % 8
    q, k, v = (torch.nn.functional.pad(t, (0, pad)) for t in (base.q, base.k, base.v))
    return ServingCase(AttentionCase.create(q, k, v, scale=base.scale), "varlen", case.q_lens, case.k_lens)


def two_queries(case: ServingCase) -> ServingCase:
    base = case.base
    q = base.q.repeat(1, 1, 2, 1)
    return ServingCase(AttentionCase.create(q, base.k, base.v, scale=base.scale), "varlen",
                       [2 * n for n in case.q_lens], case.k_lens)


def _model(case: ServingCase, device) -> torch.Tensor:
    q, k, v = (t.to(device) for t in (case.base.q, case.base.k, case.base.v))
    root = case.scale ** 0.5
    return torch.softmax((q * root) @ (k * root).transpose(-1, -2), -1) @ v


def _sequences(packed: torch.Tensor) -> torch.Tensor:
    """The packed output of one query a sequence as (B, H, 1, Dv)."""
    return packed.unsqueeze(2)


def main(device: str) -> None:
    for path in sorted(glob.glob(str(HERE / "h200" / "jagged-cases" / "*over_budget-shrunk*.json"))):
        case = load_case(path)
        print(Path(path).name, case.describe())
        for what, c in (("as found", case), ("head dim padded to a multiple of 8", padded(case)),
                        ("two queries a sequence", two_queries(case))):
            verdict = flashcheck.check("torch:jagged", c, device=device, properties=())
            print(f"  {what}: {verdict.status} max err/budget {verdict.max_ratio:.3g}")
        inputs = case.physical(device)
        kernel = flashcheck.kernels.resolve_kernel("torch:jagged", device=device)
        got = kernel.fn(*inputs.tensors, **inputs.kwargs, scale=case.scale)
        exact = flashcheck.reference_attention(case.base.q.to(device), case.base.k.to(device), case.base.v.to(device),
                                               scale=case.scale).out
        print("  model: bit-identical" if torch.equal(_model(case, device).view(torch.int16),
                                                      _sequences(got).view(torch.int16)) else "  model: differs")
        print("  got  ", got[:, 0].float().cpu().tolist())
        print("  exact", exact[:, 0, 0].cpu().tolist())


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
