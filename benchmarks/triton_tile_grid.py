"""flashcheck:triton over head dims and tile shapes on a GPU, with the V-tile rule on ("after") or off ("before").

"before" sizes the V tile as Dv padded alone, the rule that Triton 3.6 on Hopper miscompiled (see
reports/gpu-h200-2026-11-29-run2/triton-small-value-tiles.txt). Each dtype and tile shape runs in a process of its
own, since an illegal memory access poisons a CUDA context.

    python benchmarks/triton_tile_grid.py main [before,after]
    env: PROBE_DTYPES=fp16,bf16  PROBE_JOBS=12  PROBE_TIMEOUT=400 (s per process)  OUT=dir for grid.json
"""
import json, os, subprocess, sys, itertools, concurrent.futures as cf
DEV = os.environ.get("PROBE_DEVICE", "cuda")
DS, DVS, NKS = (16, 24, 32, 40, 64, 128, 200, 256), (8, 16, 24, 32, 64, 128), (1, 63, 200)

def child(mode, dtype, bm, bn):
    import torch
    from flashcheck.inputs.case import AttentionCase
    from flashcheck.judge.check import check
    from flashcheck.kernels.triton import forward as triton_flash
    if mode == "before":
        triton_flash._value_tile = lambda dv, bd: triton_flash._padded(dv)
    kern = triton_flash.make_kernel(block_m=bm, block_n=bn)
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)
    bad = []
    n = 0
    for D, Dv, Nk in itertools.product(DS, DVS, NKS):
        q = torch.randn(2, 4, 52, D, generator=g).to(dt)
        k = torch.randn(2, 1, Nk, D, generator=g).to(dt)
        v = torch.randn(2, 1, Nk, Dv, generator=g).to(dt)
        case = AttentionCase.create(q, k, v, scale=D ** -0.5, causal="none")
        for rep in range(2):
            verdict = check(kern, case, device=DEV, properties=("determinism",), envelope=False)
            n += 1
            if verdict.status != "PASS":
                kinds = sorted({f.kind for f in verdict.findings})
                bad.append(f"D={D} Dv={Dv} Nk={Nk} {verdict.status} {kinds} {verdict.max_ratio:.3g} "
                           + verdict.findings[0].diagnosis.splitlines()[0][:120])
                if "crash" in kinds and "CUDA" in " ".join(f.diagnosis for f in verdict.findings):
                    return dict(cases=n, bad=bad, stopped=f"crash at D={D} Dv={Dv} Nk={Nk}")
                break
    return dict(cases=n, bad=bad, stopped=None)

def trial(args):
    try:
        p = subprocess.run([sys.executable, __file__, "child", *map(str, args)], capture_output=True, text=True,
                           timeout=int(os.environ.get("PROBE_TIMEOUT", 400)))
    except subprocess.TimeoutExpired:
        return args, dict(cases=0, bad=[], stopped="timeout")
    res = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    return args, (json.loads(res[-1][7:]) if res else dict(cases=0, bad=[], stopped=(p.stdout + p.stderr)[-300:]))

if __name__ == "__main__":
    if sys.argv[1] == "child":
        mode, dtype, bm, bn = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        print("RESULT " + json.dumps(child(mode, dtype, bm, bn)), flush=True)
        sys.exit(0)
    modes = sys.argv[2].split(",") if len(sys.argv) > 2 else ["before", "after"]
    blocks = ((64, 64), (128, 64), (64, 128))
    dtypes = os.environ.get("PROBE_DTYPES", "fp16,bf16,fp32").split(",")
    jobs = [(m, dt, bm, bn) for m in modes for dt in dtypes for bm, bn in blocks]
    with cf.ThreadPoolExecutor(int(os.environ.get("PROBE_JOBS", 12))) as ex:
        results = list(ex.map(trial, jobs))
    json.dump([[list(a), r] for a, r in results], open(os.path.join(os.environ.get("OUT", "/tmp"), "grid.json"), "w"), indent=1)
    for mode in modes:
        rows = [(a, r) for a, r in results if a[0] == mode]
        print(f"== {mode}: {sum(r['cases'] for _, r in rows)} checks, "
              f"{sum(len(r['bad']) for _, r in rows)} not PASS, {sum(bool(r['stopped']) for _, r in rows)} processes stopped by a crash")
        for a, r in rows:
            if r["bad"] or r["stopped"]:
                print(f"  {a[1]} {a[2]}x{a[3]}: {len(r['bad'])} bad of {r['cases']}; stopped: {r['stopped']}")
                for b in r["bad"][:6]: print("     ", b)
