"""Benchmark: campaign throughput, with the time split per case, and the time to the first case.

Each row runs `flashcheck fuzz` as a user would (a fresh process, `--json`), for a fixed time budget,
and reads its summary: cases/s, and the milliseconds per case spent generating, in the kernel, in the
oracle and budget, in the exact properties and in the envelope. Rows run one after another in one
call, so their ratios are comparable; `--src` runs the same rows on another checkout's `src/` (an
older commit, say) for a before/after table in the same run (rows that need an option the older code
lacks are left out there).

    python benchmarks/bench_campaign.py --device cuda --rows flash-1,flash-8,triton-8-cold,triton-8-warm
    python benchmarks/bench_campaign.py --device cpu --rows cpu-smoke-1,cpu-smoke-2 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
TIMED_EXAMPLES = 100_000  # the cap of a timed row: its time budget ends it
# "draw": hypothesis's choice of a recipe and the campaign's bookkeeping; "generation": drawing its tensors.
# A summary of older code has no "draw" part (its "generation" held both): that column reads 0 there.
PARTS = ("draw", "generation", "transfer", "kernel", "oracle", "properties", "envelope")
LONG = str(HERE / "benchmarks" / "long-64k.toml")

# name -> (fuzz arguments, needs --jobs support, fresh Triton cache)
ROWS = {
    "startup-math": (["torch:math", "--preset", "smoke", "--max-examples", "1", "--no-isolation"], False, False),
    "startup-flash": (["torch:flash", "--preset", "smoke", "--max-examples", "1", "--no-isolation"], False, False),
    "startup-flash-worker": (["torch:flash", "--preset", "smoke", "--max-examples", "1"], False, False),
    "flash-1": (["torch:flash", "--preset", "adversarial", "--keep-going", "--no-isolation"], False, False),
    "flash-1-worker": (["torch:flash", "--preset", "adversarial", "--keep-going"], False, False),
    "flash-8": (["torch:flash", "--preset", "adversarial", "--keep-going", "--jobs", "8"], True, False),
    # --jobs rows every checkout since --jobs came runs (False: older code is not left out of them)
    "flash-2": (["torch:flash", "--preset", "adversarial", "--keep-going", "--jobs", "2"], False, False),
    "flash-4": (["torch:flash", "--preset", "adversarial", "--keep-going", "--jobs", "4"], False, False),
    "flash-16": (["torch:flash", "--preset", "adversarial", "--keep-going", "--jobs", "16"], False, False),
    "flash-1-backward": (["torch:flash", "--preset", "adversarial", "--keep-going", "--backward"], False, False),
    "flash-16-backward": (["torch:flash", "--preset", "adversarial", "--keep-going", "--backward", "--jobs", "16"],
                          False, False),
    "long-1": (["torch:flash", "--preset", LONG, "--keep-going"], False, False),
    "long-4": (["torch:flash", "--preset", LONG, "--keep-going", "--jobs", "4"], False, False),
    # the whole long-context preset: 16k to 128k keys, decode rows to 1M keys, tensors past 2^31 elements
    "longctx-4": (["torch:flash", "--preset", "long-context", "--keep-going", "--jobs", "4"], False, False),
    "efficient-1": (["torch:efficient", "--preset", "adversarial", "--keep-going", "--no-isolation"], False, False),
    "triton-1": (["flashcheck:triton", "--preset", "smoke", "--keep-going"], False, False),
    "triton-8-cold": (["flashcheck:triton", "--preset", "smoke", "--keep-going", "--jobs", "8"], True, True),
    "triton-8-warm": (["flashcheck:triton", "--preset", "smoke", "--keep-going", "--jobs", "8"], True, False),
    "cpu-smoke-1": (["flashcheck:triton", "--preset", "smoke", "--max-examples", "160"], False, False),
    "cpu-smoke-2": (["flashcheck:triton", "--preset", "smoke", "--max-examples", "160", "--jobs", "2"], True, False),
    # Timed: every worker busy to the end, so none waits for another (as in a campaign with a time budget).
    "cpu-smoke-1-timed": (["flashcheck:triton", "--preset", "smoke", "--keep-going"], False, False),
    "cpu-smoke-2-timed": (["flashcheck:triton", "--preset", "smoke", "--keep-going", "--jobs", "2"], True, False),
}


def run_row(name: str, *, src: Path, device: str, seconds: float, seed: int, cache: Path, work: Path) -> dict:
    args, _, fresh_cache = ROWS[name]
    if fresh_cache and cache.exists():
        subprocess.run(["rm", "-rf", str(cache)], check=True)
    work.mkdir(parents=True, exist_ok=True)
    summary = work / f"{name}.json"
    cmd = [sys.executable, "-m", "flashcheck.cli", "fuzz", *args, "--device", device, "--seed", str(seed),
           "--no-progress", "--corpus", str(work / f"corpus-{name}"), "--json", str(summary)]
    if "--max-examples" not in args:
        cmd += ["--time-budget", str(seconds), "--max-examples", str(TIMED_EXAMPLES)]
    env = dict(os.environ, PYTHONPATH=str(src), FLASHCHECK_TRITON_CACHE=str(cache), TRITON_CACHE_DIR=str(cache))
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if not summary.exists():
        return {"row": name, "error": (proc.stderr or proc.stdout)[-400:], "wall_s": wall}
    d = json.loads(summary.read_text())
    cases = max(d.get("cases", 0), 1)
    split = d.get("time_split_s", {})
    return {"row": name, "verdict": d.get("verdict"), "cases": d.get("cases", 0), "wall_s": round(wall, 2),
            "elapsed_s": d.get("elapsed_s", 0.0), "sources": d.get("sources"),
            "cases_per_s": d.get("cases_per_s"), "first_case_s": _first_case_s(d),
            "steady_cases_per_s": d.get("steady_cases_per_s"), "compilations": d.get("compilations"),
            "compile_s": split.get("compile"), "skipped": d.get("skipped") or {},
            "skipped_reasons": d.get("skipped_reasons") or {},
            "ms_per_case": {p: round(1000 * split.get(p, 0.0) / cases, 2) for p in PARTS}}


def _first_case_s(summary: dict) -> float | None:
    """Seconds from the start to the first judged case (the slowest worker's, with --jobs)."""
    per = [s.get("first_case_s") for s in summary.get("sources") or [summary]]
    return None if None in per or not per else max(per)


def _without(args: list, option: str) -> list:
    """``args`` less ``option`` and its value."""
    if option not in args:
        return list(args)
    i = args.index(option)
    return args[:i] + args[i + 2:]


def same_cases_speedup(name: str, result: dict, *, src: Path, device: str, seconds: float, cache: Path,
                       work: Path) -> None:
    """Run what each worker of a ``--jobs N`` row drew, worker after worker, in one process: the same case
    streams, so the ratio of cases/s is the speed-up of the workers, not of a luckier case mix.

    A row with ``--max-examples`` replays each worker's cases exactly (its seed and its share of the
    examples). A timed row replays each worker's stream for 1/N of the time: the same streams (a stream
    depends on the seed and max_examples), cut earlier, where hypothesis draws smaller cases, so the
    one-process figure is if anything flattered."""
    sources = result["sources"]
    one = _without(ROWS[name][0], "--jobs")
    timed = "--max-examples" not in one
    cases = elapsed = 0.0
    for i, source in enumerate(sources):
        share = TIMED_EXAMPLES // len(sources) if timed else source["examples"]
        ROWS[f"{name}/job{i}"] = (_without(one, "--max-examples") + ["--max-examples", str(share)], False, False)
        if timed:
            ROWS[f"{name}/job{i}"][0].extend(["--time-budget", str(seconds / len(sources))])
        r = run_row(f"{name}/job{i}", src=src, device=device, seconds=0, seed=source["seed"], cache=cache, work=work)
        cases += r.get("cases", 0)
        elapsed += r.get("elapsed_s", 0.0)
    result["same_cases_one_process_per_s"] = round(cases / elapsed, 3) if elapsed else None
    result["same_cases_speedup"] = round(result["cases_per_s"] / result["same_cases_one_process_per_s"], 3) \
        if result.get("cases_per_s") and elapsed else None


def _table(results: list[dict]) -> str:
    head = f"{'label':8} {'row':15} {'cases':>6} {'cases/s':>8} {'steady':>7} {'first s':>7} {'wall s':>7} " + \
           " ".join(f"{p[:6]:>7}" for p in PARTS) + f" {'compiles':>9}  verdict"
    lines = [head, "-" * len(head)]
    for r in results:
        if "error" in r:
            lines.append(f"{r['label']:8} {r['row']:15} failed: {r['error'].splitlines()[-1] if r['error'] else '?'}")
            continue
        ms = " ".join(f"{r['ms_per_case'][p]:7.1f}" for p in PARTS)
        comp = "" if r.get("compilations") is None else f"{r['compilations']} / {r.get('compile_s') or 0:.0f}s"
        steady = "" if r.get("steady_cases_per_s") is None else f"{r['steady_cases_per_s']:.1f}"
        first = "" if r.get("first_case_s") is None else f"{r['first_case_s']:.2f}"
        skips = ", ".join(f"{n} {kind}" for kind, n in sorted((r.get("skipped") or {}).items()) if n)
        lines.append(f"{r['label']:8} {r['row']:15} {r['cases']:6} {r['cases_per_s'] or 0:8.2f} {steady:>7} {first:>7} "
                     f"{r['wall_s']:7.1f} "
                     f"{ms} {comp:>9}  {r['verdict']}" + (f" ({skips} skipped)" if skips else ""))
        if r.get("same_cases_speedup"):
            lines.append(f"{'':8} {'':15} the same cases one worker seed after another in one process: "
                         f"{r['same_cases_one_process_per_s']:.2f} cases/s, speed-up {r['same_cases_speedup']:.2f}x")
    return "\n".join(lines) + ("\n(cases/s over the whole run; steady: once every process has judged its first case; "
                               "first s: the first judged case after start; ms per case: draw (hypothesis), "
                               "generation, transfer (the worker's pipe), kernel, oracle+budget, properties, envelope)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--rows", default="cpu-smoke-1,cpu-smoke-2", help=f"comma-separated, from {sorted(ROWS)}")
    parser.add_argument("--seconds", type=float, default=60.0, help="time budget of each timed row")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="run the row list this many times, interleaved")
    parser.add_argument("--src", action="append", default=[], metavar="LABEL=PATH",
                        help="also run the rows on another checkout's src/ (repeatable), e.g. before=/tmp/old/src")
    parser.add_argument("--same-cases", action="store_true",
                        help="for rows with --jobs N, also run their N worker seeds one after another in one process")
    parser.add_argument("--examples", type=int, default=None,
                        help="cases of the rows with a fixed count (cpu-smoke-1, cpu-smoke-2), instead of theirs")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    if args.examples is not None:
        for name, (fuzz_args, jobs, fresh) in list(ROWS.items()):
            if "--max-examples" in fuzz_args and not name.startswith("startup"):
                ROWS[name] = (_without(fuzz_args, "--max-examples") + ["--max-examples", str(args.examples)], jobs, fresh)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"--rows: unknown {unknown}; pick from {sorted(ROWS)}")
    sources = [("now", HERE / "src")] + [(s.split("=", 1)[0], Path(s.split("=", 1)[1])) for s in args.src]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for _ in range(args.repeat):
            for label, src in sources:
                cache = work / f"triton-cache-{label}"
                for row in rows:
                    if label != "now" and ROWS[row][1]:
                        continue  # older code has no --jobs
                    r = run_row(row, src=src, device=args.device, seconds=args.seconds, seed=args.seed,
                                cache=cache, work=work / label)
                    r["label"] = label
                    if args.same_cases and "--jobs" in ROWS[row][0] and "error" not in r:
                        same_cases_speedup(row, r, src=src, device=args.device, seconds=args.seconds, cache=cache,
                                           work=work / label)
                    results.append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
    print(_table(results))
    if args.json:
        sys.path.insert(0, str(HERE / "src"))
        from flashcheck.files import write_json

        write_json(args.json, results)
    return results


if __name__ == "__main__":
    main()
