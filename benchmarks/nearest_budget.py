"""The cases of a self-test row that come nearest their error budget, with the budget term by term.

A correct kernel's err/budget must stay below 1 on every case; a row whose worst case sits at 0.999 is a
false alarm away. This re-draws the self-test's case list for one kernel and dtype (the same
``draw_recipes`` call as ``flashcheck selftest``), checks every case, and prints the nearest ones with their
verdicts (worst element, its budget term by term, the regime).

    python benchmarks/nearest_budget.py --kernel 'flashcheck:triton[block_m=64,block_n=64]' --dtype fp32 \
        --device cuda --cases 520 --max-n 1024 --head-dims 64,128 --top 5
"""

from __future__ import annotations

import argparse
import json


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", action="append", required=True, help="repeatable")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--cases", type=int, default=520)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-n", type=int, default=1024)
    parser.add_argument("--head-dims", default="64,128")
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.judge.check import check
    from flashcheck.judge.properties import properties_for
    from flashcheck.kernels.registry import resolve_kernel

    head_dims = tuple(int(x) for x in args.head_dims.split(","))
    out = []
    for name in args.kernel:
        kernel = resolve_kernel(name, device=args.device)
        recipes = draw_recipes(args.cases, seed=args.seed, spec=kernel.spec, dtypes=[args.dtype], max_n=args.max_n,
                               max_heads=4, head_dims=head_dims)
        judged = []
        for i, recipe in enumerate(recipes):
            verdict = check(kernel, recipe.build(kernel=kernel.name), device=args.device, properties=properties_for(i))
            judged.append((verdict.max_ratio, i, recipe, verdict))
        judged.sort(key=lambda t: -t[0] if t[0] == t[0] else 0)
        print(f"== {kernel.name} {args.dtype}: {len(judged)} cases; nearest their budget:")
        for ratio, i, recipe, verdict in judged[:args.top]:
            worst = worst_element(kernel, recipe.build(kernel=kernel.name), args.device)
            print(f"-- case {i + 1}: err/budget {ratio:.4f}, {recipe}")
            print("   " + json.dumps(worst))
            out.append({"kernel": kernel.name, "case": i + 1, "ratio": ratio, "recipe": recipe.as_dict(),
                        "worst": worst, "verdict": verdict.as_dict()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


def worst_element(kernel, case, device: str) -> dict:
    """The element of the case's output nearest its budget: its error, its budget term by term, and the
    scale of its row (largest |logit|, o, w)."""
    import torch

    from flashcheck.judge.check import run_kernel
    from flashcheck.judge.comparison import error_ratios, on_oracle_rows
    from flashcheck.numerics.budget import error_budget

    q, k, v, mask = case.to_device(device)
    run = run_kernel(kernel, q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask)
    budget = error_budget(case.q.to(device), case.k.to(device), case.v.to(device), scale=case.scale,
                          causal=case.causal, attn_mask=mask, precision=kernel.spec.precision)
    ref = budget.reference
    got = on_oracle_rows(run.out, ref).double()
    ratio, err = error_ratios(got, ref.out, budget.total, ref.empty_rows)
    index = tuple(int(x) for x in torch.nonzero(ratio == ratio.max())[0])
    b, h, r, c = index
    kv = h // (q.shape[1] // k.shape[1])
    logits = (case.q[b, h, r].double() @ case.k[b, kv].double().T) * case.scale
    return {"index": index, "ratio": float(ratio[index]), "error": float(err[index]), "got": float(got[index]),
            "exact": float(ref.out[index]), "w": float(ref.w[index]),
            "max_abs_logit": float(logits.abs().max()), "terms": budget.breakdown(index)}


if __name__ == "__main__":
    raise SystemExit(main())
