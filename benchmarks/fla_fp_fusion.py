"""Why fla:parallel_attn's fp16 output lands one step off on rows where one key holds all the weight (CUDA).

Hypothesis: Triton fuses ``s * RCP_LN2 - m`` into one FMA (its default ``enable_fp_fusion``) in fla's loop over
the key blocks before the diagonal one, where no ``tl.where`` stands between them. The running max ``m`` is the
rounded logit, the FMA's product is not: the top key gets p = exp2(r), r the logit's rounding error (up to half
an fp32 ulp of a logit of 5e4, 2^-9), instead of 1. The row sum keeps that p in fp32; P @ V takes it rounded to
fp16, so the output is scaled by fp16(p) / p, up to 2^-11 off.

For each row whose top key holds all the weight (the next one at least 40 base-2 units below), so that the exact
output is that key's V row, this counts the outputs that differ from it, apart for rows whose top key lies
before the diagonal block (fused) and in it (a tl.where between: not fused). Run it twice, with and without
TRITON_DEFAULT_FP_FUSION=0: the control.
Usage (repository root, fla-core installed): python3 benchmarks/fla_fp_fusion.py CASE.json [DEVICE]
(DEVICE cuda, the default; cpu runs fla under the Triton interpreter, TRITON_INTERPRET=1, where nothing fuses)
"""

from __future__ import annotations

import json
import os
import sys

import torch

from flashcheck.inputs.casefile import load_case
from flashcheck.kernels.registry import resolve_kernel

BT = 128  # fla's query block: keys of earlier blocks go through the loop without a tl.where


def dominated_rows(case, gap: float = 40.0):
    """(b, h, i, top key) of the rows whose top key beats the next key and the sink by ``gap`` base-2 units (causal
    top-left)."""
    q, k = case.q.double(), case.k.double().repeat_interleave(case.shapes.group, dim=1)
    s = (q @ k.transpose(-1, -2)) * case.scale * 1.4426950408889634
    n = case.shapes.n_q
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -torch.inf)
    top2 = s.topk(2, dim=-1)
    sinks = case.variant.sinks.double().view(1, -1, 1) * 1.4426950408889634  # a sink takes weight too
    runner_up = torch.maximum(top2.values[..., 1], sinks)
    for b, h, i in (top2.values[..., 0] - runner_up > gap).nonzero().tolist():
        yield b, h, i, int(top2.indices[b, h, i, 0])


def main(path: str, device: str = "cuda") -> int:
    case = load_case(path)
    kernel = resolve_kernel("fla:parallel_attn", device=device)
    q, k, v = (t.to(device) for t in (case.q, case.k, case.v))
    out = kernel(q, k, v, scale=case.scale, causal=case.causal, sinks=case.variant.sinks.to(device))
    out = (out[0] if isinstance(out, tuple) else out).cpu()
    rows = {}
    for b, h, i, j in dominated_rows(case):
        got, exact = out[b, h, i], case.v[b, h // case.shapes.group, j]
        group = rows.setdefault("top key before the diagonal block" if j < (i // BT) * BT else
                                "top key in the diagonal block", dict(rows=0, rows_exact=0, elements=0, off=0))
        off = int((got != exact).sum())
        group["rows"] += 1
        group["rows_exact"] += off == 0
        group["elements"] += got.numel()
        group["off"] += off
    rows["fp_fusion"] = os.environ.get("TRITON_DEFAULT_FP_FUSION", "default")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
