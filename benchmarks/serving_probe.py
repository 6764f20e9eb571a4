"""Probe of the serving references' edge cases on this machine: where the CPU campaigns found PyTorch's jagged
nested tensors and FlexAttention's document mask crash (empty sequences, a batch without tokens), what the same
cases give here. Prints one line per (kernel, case). Usage: python benchmarks/serving_probe.py [cuda|cpu]"""

from __future__ import annotations

import sys

import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.serving import ServingCase

CASES = {"every sequence one query, one without keys": ([1, 1], [1, 0]), "the other without keys": ([1, 1], [0, 1]),
         "longer rows, one without keys": ([2, 3], [4, 0]), "no tokens": ([0, 0], [0, 0]),
         "control, keys everywhere": ([1, 1], [1, 1]), "control, one without queries": ([0, 1], [1, 1])}


def case(q_lens, k_lens, dtype) -> ServingCase:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(len(q_lens), 2, max(max(n), 1), 64, generator=gen).to(dtype)
               for n in (q_lens, k_lens, k_lens))
    return ServingCase(AttentionCase.create(q, k, v, scale=0.125), "varlen", q_lens, k_lens)


def main(device: str) -> None:
    for kernel in ("torch:jagged", "torch:flex-varlen" if device == "cuda" else "torch:flex-varlen[compile=False]"):
        for dtype in (torch.float16, torch.float32):
            for what, (q_lens, k_lens) in CASES.items():
                verdict = flashcheck.check(kernel, case(q_lens, k_lens, dtype), device=device, properties=())
                found = "; ".join(f"{f.kind}: {f.diagnosis[:110]}" for f in verdict.findings)
                print(f"{kernel} {str(dtype)[6:]} {what} q={q_lens} k={k_lens}: {verdict.status} {found}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda")
