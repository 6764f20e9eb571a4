"""Profile: what one case costs, part by part, and how many device kernels the oracle and budget launch.

Draws a fixed list of cases from a preset (the same list for every checkout, see `draw_recipes`), then
for each case: builds it (generation; on the host, or with --draw-on device where a GPU campaign draws it),
runs `check` in this process, without the exact properties unless --properties (transfer, kernel, oracle +
budget, properties, envelope, from the verdict's own timings; --each prints them case by case), and counts the operator calls and
CUDA kernels of the oracle and budget under torch.profiler on the first few cases. Works on older
checkouts too (run with PYTHONPATH=that/src), which compute the oracle and the budget in two walks.

    python benchmarks/profile_case.py --device cuda --kernel torch:flash --cases 100
"""

from __future__ import annotations

import argparse
import statistics
import time


def _oracle_and_budget(case, device, precision):
    """The oracle and budget as `check` computes them in this checkout."""
    from flashcheck.numerics import oracle
    from flashcheck.numerics.budget import error_budget

    q, k, v, mask = (None if t is None else t.to(device) for t in (case.q, case.k, case.v, case.attn_mask))
    kw = dict(scale=case.scale, causal=case.causal, attn_mask=mask)
    if hasattr(oracle, "float64_reference_walk"):  # one walk for both
        return error_budget(q, k, v, **kw, precision=precision)
    return error_budget(q, k, v, **kw, precision=precision, reference=oracle.reference_attention(q, k, v, **kw))


def _launches(fn, device) -> tuple[int, int]:
    """(operator calls, device kernels) of one call of ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
    events = prof.events()
    ops = sum(1 for e in events if e.name.startswith("aten::") and not e.cpu_parent)
    kernels = sum(1 for e in events if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type))
    return ops, kernels


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--kernel", default="torch:math")
    parser.add_argument("--preset", default="adversarial")
    parser.add_argument("--cases", type=int, default=60)
    parser.add_argument("--profiled", type=int, default=5, help="cases whose launches are counted")
    parser.add_argument("--label", default="now")
    parser.add_argument("--draw-on", default="host", choices=("host", "device"),
                        help="draw each case on the host (the default) or on --device, as a GPU campaign does")
    parser.add_argument("--properties", action="store_true", help="check the exact properties too, as campaigns do")
    parser.add_argument("--each", action="store_true", help="print one line per case: its shape and its parts")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from flashcheck.judge.check import check
    from flashcheck.judge.properties import PROPERTIES
    from flashcheck.kernels.registry import resolve_kernel
    from flashcheck.inputs.presets import load_preset
    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.files import write_json

    kernel = resolve_kernel(args.kernel, device=args.device)
    preset = load_preset(args.preset)
    dtypes = [d for d in preset.dtypes if d in kernel.spec.dtypes]
    recipes = draw_recipes(args.cases, seed=0, spec=kernel.spec, dtypes=dtypes, **preset.strategy_options())
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    measured = ("transfer", "kernel", "oracle", "properties", "envelope")
    parts = {p: [] for p in ("generation", *measured, "total")}
    launches = []
    draw_on = args.device if args.draw_on == "device" else None
    properties = PROPERTIES if args.properties else ()
    for i, recipe in enumerate(recipes):
        t0 = time.perf_counter()
        case = recipe.build(kernel=kernel.name, draw_on=draw_on)
        sync()
        parts["generation"].append(time.perf_counter() - t0)
        t1 = time.perf_counter()
        verdict = check(kernel, case, device=args.device, properties=properties)
        sync()
        parts["total"].append(time.perf_counter() - t0)
        for p in measured:
            parts[p].append(verdict.elapsed.get(p, 0.0))
        if args.each:
            s = recipe.shapes
            print(f"{i:4} {recipe.dtype:9} B={s.batch} Hq={s.heads_q} Nq={s.n_q:<6} Nk={s.n_k:<8} D={s.head_dim:<4} "
                  f"{recipe.layout:11} {recipe.elements:10} {verdict.skipped or verdict.status:8} " +
                  " ".join(f"{p} {1000 * parts[p][-1]:.1f}" for p in ("generation", *measured, "total")))
        if i < args.profiled and not verdict.skipped:
            precision = kernel.spec.precision
            launches.append(_launches(lambda: _oracle_and_budget(case, args.device, precision), args.device))
        del t1
    row = {"label": args.label, "kernel": kernel.name, "device": args.device, "cases": len(recipes),
           "ms_mean": {p: round(1000 * statistics.fmean(v), 2) for p, v in parts.items()},
           "ms_median": {p: round(1000 * statistics.median(v), 2) for p, v in parts.items()},
           "oracle_budget_ops_per_case": statistics.fmean(o for o, _ in launches) if launches else None,
           "oracle_budget_kernels_per_case": statistics.fmean(k for _, k in launches) if launches else None}
    print(f"{args.label:8} {kernel.name:16} {args.device:5} cases {len(recipes):4}  ms/case (mean): " +
          ", ".join(f"{p} {v}" for p, v in row["ms_mean"].items()) +
          f"  | oracle+budget: {row['oracle_budget_ops_per_case']} ops, {row['oracle_budget_kernels_per_case']} "
          "CUDA kernels per case")
    if args.json:
        write_json(args.json, row)
    return row


if __name__ == "__main__":
    main()
