"""Which kernel of flashcheck:triton still shows the Hopper narrow-V-tile miscompilation (reports/upstream-2026-12-04/
triton-hopper-narrow-v-tile/), one process per variant (an illegal memory access poisons a CUDA context).

Variants:
- ``old``: the forward kernel of commit b60c78b (2026-11-29, before the V-tile rule), imported from the package
  tree in OLD_SRC (``git archive b60c78b src | tar -x -C DIR``), with its V tile Dv padded alone;
  ``spec`` says which integer arguments Triton may specialise (== 1, divisible by 16): ``strides`` (as on
  2026-11-29: sizes not specialised, strides are), ``none`` (neither, as flashcheck:triton is today), ``all``;
- ``now``: today's kernel with its V-tile rule taken out, its strides specialised or not.
Each runs fp16 B=2 Hq=4 Hkv=1 Nq=52 D=24 Dv=16 at Nk = 63, 200, 1 (two calls each), and ``saved`` replays the
shrunk case of 2026-11-29 (reports/gpu-h200-2026-11-29-run2/case/) three times.

    OLD_SRC=DIR python benchmarks/triton_narrow_v_probe.py main > probe.txt
"""
from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

SAVED = Path("reports/gpu-h200-2026-11-29-run2/case/flashcheck-triton-block_m-64-block_n-64-crash-shrunk-4a3b5e3222")
SHAPE = dict(B=2, HQ=4, HKV=1, NQ=52, D=24, DV=16)


def _old_kernel(spec: str):
    sys.path.insert(0, os.environ["OLD_SRC"])
    from flashcheck.kernels import triton_flash as old
    strides = [n for n in old._flash_attention_fwd.__code__.co_varnames[:40] if n.startswith("stride_")]
    old._SIZE_ARGUMENTS = {"strides": old._SIZE_ARGUMENTS, "none": old._SIZE_ARGUMENTS + tuple(strides),
                           "all": ()}[spec]
    return lambda q, k, v, scale, stages: old.triton_attention(q, k, v, scale=scale, num_stages=stages)[0]


def _new_kernel(spec: str):
    from flashcheck.kernels.triton import forward as now
    now._value_tile = lambda dv, bd: now._padded(dv)
    if spec == "strides":
        now._JIT_OPTIONS = {"do_not_specialize": now._SIZE_ARGUMENTS}
    return lambda q, k, v, scale, stages: now.triton_attention(q, k, v, scale=scale, num_stages=stages)[0]


def _inputs(nk: int, saved: bool):
    import numpy as np
    import torch
    if saved:
        arrays = np.load(f"{SAVED}.npz")
        q, k, v = (torch.from_numpy(arrays[n]).cuda() for n in ("q", "k", "v"))
        return q, k, v, json.loads(Path(f"{SAVED}.json").read_text())["scale"]
    g = torch.Generator().manual_seed(nk)
    s = SHAPE
    q, k, v = (torch.randn(*shape, generator=g).half().cuda() for shape in
               ((s["B"], s["HQ"], s["NQ"], s["D"]), (s["B"], s["HKV"], nk, s["D"]), (s["B"], s["HKV"], nk, s["DV"])))
    return q, k, v, s["D"] ** -0.5


def _error(out, q, k, v, scale) -> float:
    import torch
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    exact = torch.softmax(q.double() @ k.transpose(-1, -2) * scale, dim=-1) @ v
    return float((out.double() - exact).abs().max())


def child(kernel: str, spec: str, stages: int | None, saved: bool) -> dict:
    import torch
    attention = (_old_kernel if kernel == "old" else _new_kernel)(spec)
    rows = []
    for nk in ((None,) if saved else (63, 200, 1)):
        q, k, v, scale = _inputs(nk, saved)
        for call in range(3 if saved else 2):
            try:
                out = attention(q, k, v, scale, stages)
                torch.cuda.synchronize()
            except Exception as exc:  # the defect's second form: an illegal memory access
                rows.append(dict(nk=nk, call=call, raised=str(exc).splitlines()[0][:120]))
                return dict(rows=rows)
            rows.append(dict(nk=nk, call=call, error=_error(out, q, k, v, scale)))
    return dict(rows=rows)


def run(variant: tuple) -> tuple:
    cmd = [sys.executable, __file__, "child", json.dumps(variant)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return variant, "timed out"
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    return variant, json.loads(lines[-1]) if lines else f"rc={done.returncode} {done.stderr[-400:]}"


def main() -> None:
    variants = [("old", spec, stages, False) for spec, stages in itertools.product(("strides", "none", "all"),
                                                                                   (None, 2, 4))]
    variants += [("old", "strides", None, True), ("old", "none", None, True)]
    variants += [("now", spec, stages, False) for spec, stages in itertools.product(("strides", "none"), (None, 4))]
    variants += [("now", "strides", None, True)]
    with cf.ThreadPoolExecutor(int(os.environ.get("PROBE_JOBS", "8"))) as pool:
        for variant, result in pool.map(run, variants):
            kernel, spec, stages, saved = variant
            if isinstance(result, str):
                summary = result
            else:
                bad = [r for r in result["rows"] if "raised" in r or r["error"] > 1e-2]
                summary = "; ".join(f"Nk={r['nk']} call {r['call']}: " + (r.get("raised") or f"{r['error']:.3g}")
                                    for r in bad) or f"ok ({len(result['rows'])} calls, max {max(r['error'] for r in result['rows']):.3g})"
            print(f"{kernel:3} spec={spec:7} stages={str(stages):4} {'saved' if saved else 'drawn'}: {summary}",
                  flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "child":
        kernel, spec, stages, saved = json.loads(sys.argv[2])
        print(json.dumps(child(kernel, spec, stages, saved)))
    else:
        main()
