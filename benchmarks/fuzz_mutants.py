"""Campaigns against every planted bug and every correct kernel, with the smoke preset.

For each variant: the verdict, the cases the campaign needed to find the bug, the size of the shrunk
case, whether `flashcheck replay` of each saved finding gives the same verdict, and throughput with the
time split. Prints one table; `--json` keeps the rows.

    python benchmarks/fuzz_mutants.py --device cpu --json fuzz_mutants.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-examples", type=int, default=None)
    parser.add_argument("--variant", action="append", default=None, help="only these (repeatable)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton

    from flashcheck.campaign.run import run_campaign
    from flashcheck.inputs.case import AttentionCase
    from flashcheck.judge.check import check
    from flashcheck.kernels.registry import resolve_kernel
    from flashcheck.kernels.triton.planted import MUTANTS
    from flashcheck.inputs.presets import load_preset
    from flashcheck.selftest.subjects import CORRECT_TILES, MUTANT_TILE
    from flashcheck.files import write_json
    from flashcheck.campaign.serve import quiet_interpreter

    quiet_interpreter()
    precision = "ieee" if args.device == "cpu" else "tf32"
    tile = f"block_m={MUTANT_TILE[0]},block_n={MUTANT_TILE[1]},input_precision={precision}"
    names = [(f"flashcheck:triton[block_m={m},block_n={n},input_precision={precision}]", True)
             for m, n in CORRECT_TILES]
    names += [("torch:math", True)]
    names += [(f"flashcheck:triton~{m.name}[{tile}]", False) for m in MUTANTS]
    if args.variant:
        names = [(n, c) for n, c in names if any(v in n for v in args.variant)]
    preset = load_preset(args.preset)
    rows = []
    for name, correct in names:
        corpus = tempfile.mkdtemp(prefix="fuzz-mutants-")
        start = time.perf_counter()
        result = run_campaign(name, device=args.device, preset=preset, seed=args.seed, corpus=corpus,
                              max_examples=args.max_examples, isolate=False)
        summary = result.as_dict()
        shrunk = [f for f in summary["findings"] if f.get("shrunk")]
        replays = []
        for finding in summary["findings"]:
            case = AttentionCase.load(finding["path"])
            again = check(resolve_kernel(case.provenance["kernel"], device=args.device), case, device=args.device)
            replays.append(again.status == finding["status"])
        row = {
            "variant": name, "correct": correct, "verdict": summary["verdict"],
            "examples": summary.get("examples", summary["cases"]),
            "found_at": _found_at(summary), "shrunk_case": shrunk[0]["case"] if shrunk else None,
            "kinds": shrunk[0]["kinds"] if shrunk else [],
            "replays_agree": f"{sum(replays)}/{len(replays)}",
            "cases_per_s": summary["cases_per_s"], "time_split_s": summary["time_split_s"],
            "max_ratio_by_dtype": summary["max_ratio_by_dtype"], "seconds": round(time.perf_counter() - start, 1),
        }
        rows.append(row)
        print(f"{name}: {row['verdict']} after {row['found_at']} cases; shrunk to {row['shrunk_case']}; "
              f"replays {row['replays_agree']}", file=sys.stderr, flush=True)
    print(f"{'variant':60} {'verdict':8} {'found at':>8} {'replay':>6}  shrunk case")
    for r in rows:
        print(f"{r['variant']:60} {r['verdict']:8} {str(r['found_at']):>8} {r['replays_agree']:>6}  "
              f"{r['shrunk_case'] or '-'}")
    missed = [r for r in rows if not r["correct"] and r["verdict"] != "BUG"]
    alarms = [r for r in rows if r["correct"] and r["verdict"] == "BUG"]
    print(f"\nplanted bugs found: {sum(1 for r in rows if not r['correct']) - len(missed)}/"
          f"{sum(1 for r in rows if not r['correct'])}; correct kernels with a BUG: {len(alarms)}/"
          f"{sum(1 for r in rows if r['correct'])}")
    if args.json:
        write_json(args.json, rows)
    return 1 if missed or alarms else 0


def _found_at(summary: dict):
    """The number of drawn cases before the first bug (the campaign's case log ends with it)."""
    found = [f for f in summary["findings"] if not f.get("shrunk")]
    if not found:
        return None
    return found[0].get("examples_at")


if __name__ == "__main__":
    sys.exit(main())
