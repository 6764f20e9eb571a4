"""FlashInfer's Triton two-state merge (``flashinfer.triton.cascade.merge_state``, base-2 lse) judged by
``flashcheck.check_merge(convention="pair")``, with each finding classified by the regime of its states.

    pip install flashinfer-python          # as a user installs it (0.7.4: a 101 MB wheel and its dependencies)
    TRITON_INTERPRET=1 python benchmarks/flashinfer_merge_probe.py OUTDIR [DTYPE ...]   # on the CPU
    python benchmarks/flashinfer_merge_probe.py OUTDIR [DTYPE ...]                      # on a Hopper GPU

The merge is ``flashinfer_merge.merge`` beside this script (without a GPU it lifts the wrapper's two Hopper
asserts, so that the interpreter runs the same Triton kernel). bf16 is left out on the CPU: the interpreter
(Triton 3.9) converts fp32 to bf16 by truncation (the kernel's bf16 output equals its fp32 formula truncated,
bit for bit, 1 ulp off where the GPU rounds to nearest). The states' regimes without an empty state are the control inputs.
Each failing case's states are saved in OUTDIR for ``flashcheck repro``; a table per dtype is printed last.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import torch

import flashcheck
from flashinfer_merge import merge  # beside this script: the wrapper, importable without flashcheck


def main(out: Path, dtypes: list[str]) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = int(os.environ.get("CASES", 64))
    rows = []
    for dtype in dtypes:
        verdict = flashcheck.check_merge(merge, convention="pair", lse_base="2", dtype=dtype, device=device,
                                         cases=cases, rows=4, head_dim=16, save_dir=out / f"saved-{dtype}")
        print(verdict)
        found = Counter(f.regime.split()[0] for f in verdict.findings)
        worst = str(verdict).splitlines()[1].strip()  # "max error/budget X (out), Y (lse)"
        rows.append((dtype, verdict.status, worst, dict(found)))
    print(f"\n{cases} cases per dtype on {device}; findings by the regime of their states:")
    for dtype, status, worst, found in rows:
        print(f"  {dtype}: {status}, {worst}; {found or 'no finding'}")


if __name__ == "__main__":
    default = ["fp32", "fp16", "bf16"] if torch.cuda.is_available() else ["fp32", "fp16"]
    main(Path(sys.argv[1]), sys.argv[2:] or default)
