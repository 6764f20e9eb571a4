"""The defect models' specificity: on correct kernels' cases nearest their budget, no model may name a defect.

Draws CASES cases a kernel (the campaign's drawing, every dtype given), judges each (the forward; the backward
with --backward), keeps the TOP nearest their budget (largest err/budget) and runs the defect models' matching on
each as if it were a bug. A row a kernel and pass: the cases judged, the err/budget range of the kept ones, and
how many of them a model named (which, if any): every count must be 0.

    python benchmarks/defect_sweep.py --kernel torch:math --kernel torch:flash --device cpu --cases 3000 \\
        --top 1000 [--backward] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections import Counter


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", required=True, help="repeatable")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--cases", type=int, default=3000, help="cases drawn a kernel")
    parser.add_argument("--top", type=int, default=1000, help="the cases nearest their budget that are matched")
    parser.add_argument("--dtypes", default="fp16,bf16,fp32")
    parser.add_argument("--max-n", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--seconds", type=float, default=None,
                        help="a time limit a kernel: drawing stops at 40%% of it, matching (nearest first) at its end")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = [sweep(name, args) for name in args.kernel]
    print(f"{'kernel':<22} {'pass':<8} {'judged':>7} {'matched':>7} {'err/budget of the matched':>26} "
          f"{'named':>5} {'seconds':>8}")
    for r in rows:
        print(f"{r['kernel']:<22} {r['pass']:<8} {r['judged']:>7} {r['matched']:>7} "
              f"{r['lowest']:>12.3g} .. {r['highest']:<11.3g} {r['named']:>5} {r['seconds']:>8.0f}"
              + (f"  {dict(r['models'])}" if r["models"] else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["named"] == 0 for r in rows) else 1


def sweep(name: str, args) -> dict:
    from flashcheck.defects import explain
    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.judge.backward import check_backward, drawn_backward_case
    from flashcheck.judge.check import check
    from flashcheck.kernels.registry import resolve_kernel

    start = time.perf_counter()
    kernel = resolve_kernel(name, device=args.device)
    recipes = draw_recipes(args.cases, seed=args.seed, spec=kernel.spec, dtypes=args.dtypes.split(","),
                           max_n=args.max_n)

    def judged(i, recipe):
        case = recipe.build(kernel=kernel.name)
        if args.backward:
            case = drawn_backward_case(case, i)
            return case, check_backward(kernel, case, device=args.device)
        return case, check(kernel, case, device=args.device, properties=(), envelope=False)

    limit = args.seconds or float("inf")
    nearest, judged_count = [], 0
    for i, recipe in enumerate(recipes):
        if time.perf_counter() - start > 0.4 * limit:
            break
        case, verdict = judged(i, recipe)
        if verdict.skipped or verdict.status != "PASS":
            continue
        judged_count += 1
        item = (verdict.max_ratio, i)
        (heapq.heappush if len(nearest) < args.top else heapq.heappushpop)(nearest, item)
    models, ratios = Counter(), []
    for ratio, i in sorted(nearest, reverse=True):
        if time.perf_counter() - start > limit:
            break
        case, verdict = judged(i, recipes[i])
        ratios.append(ratio)
        named = explain(kernel, case, device=args.device, verdict=verdict).named
        if named:
            models[named] += 1
        if len(ratios) % 100 == 0:  # progress: a long sweep says where it is
            print(f"{name}: {len(ratios)} matched, {sum(models.values())} named, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    return {"kernel": name, "pass": "backward" if args.backward else "forward", "judged": judged_count,
            "matched": len(ratios), "lowest": min(ratios, default=0.0), "highest": max(ratios, default=0.0),
            "named": sum(models.values()), "models": models, "seconds": time.perf_counter() - start}


if __name__ == "__main__":
    raise SystemExit(main())
