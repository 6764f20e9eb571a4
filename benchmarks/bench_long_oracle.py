"""Benchmark: the oracle and its error budget as the keys grow, with their peak memory.

Three series, each a row per length N: decode (16 queries against N keys), chunked prefill (1,024 queries
against N keys) and full prefill (N queries against N keys, up to --max-prefill); 8 query heads over 2 K/V heads,
head dim 128, bf16 inputs, causal bottom-right. Each row times ``error_budget`` (one walk gives the oracle and
the budget) and reports the peak memory the walk added over the inputs: torch's allocator peak on a GPU,
tracemalloc's (numpy's float64 arrays) on the CPU. Prints one table; ``--json`` and ``--plot`` write the rows
and a log-log plot of time against N.
Usage: python benchmarks/bench_long_oracle.py --device cuda --max-n 131072 --max-decode 1048576 --json out.json
--plot out.png
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import torch

from flashcheck.files import write_json
from flashcheck.numerics.budget import error_budget

SERIES = {"decode": lambda n: 16, "chunk": lambda n: 1024, "prefill": lambda n: n}
HEADS_Q, HEADS_KV, HEAD_DIM = 8, 2, 128


def _inputs(n_q: int, n_k: int, device: str):
    gen = torch.Generator().manual_seed(n_k)
    shapes = ((1, HEADS_Q, n_q, HEAD_DIM), (1, HEADS_KV, n_k, HEAD_DIM), (1, HEADS_KV, n_k, HEAD_DIM))
    return tuple(torch.randn(s, generator=gen).to(torch.bfloat16).to(device) for s in shapes)


def measure(series: str, n: int, device: str) -> dict:
    """One row: the walk's seconds and its peak memory above the inputs, in MiB."""
    n_q = min(SERIES[series](n), n)
    q, k, v = _inputs(n_q, n, device)
    inputs_mib = sum(t.numel() * t.element_size() for t in (q, k, v)) / 2**20
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        tracemalloc.start()
    t0 = time.perf_counter()
    budget = error_budget(q, k, v, scale=HEAD_DIM ** -0.5, causal="bottom_right", precision="flash")
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if device == "cuda":
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    assert bool(torch.isfinite(budget.reference.out).all()), "the oracle gave a non-finite output"
    return {"series": series, "n_q": n_q, "n_k": n, "seconds": seconds, "peak_mib": peak, "inputs_mib": inputs_mib,
            "device": device}


def lengths(max_n: int) -> list[int]:
    out, n = [], 1024
    while n <= max_n:
        out.append(n)
        n *= 2
    return out


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for series in SERIES:
        mine = [r for r in rows if r["series"] == series]
        if mine:
            ax.loglog([r["n_k"] for r in mine], [r["seconds"] for r in mine], "o-", label=f"{series} "
                      f"({'N' if series == 'prefill' else mine[0]['n_q']} queries)")
    ax.set_xlabel("keys N")
    ax.set_ylabel("oracle + budget (s)")
    ax.set_title(f"flashcheck's oracle on {rows[0]['device']}: Hq={HEADS_Q}, Hkv={HEADS_KV}, D={HEAD_DIM}, bf16")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--max-n", type=int, default=131072, help="the longest keys of chunk rows")
    parser.add_argument("--max-decode", type=int, default=None, help="the longest keys of decode rows (--max-n)")
    parser.add_argument("--max-prefill", type=int, default=16384, help="the longest full prefill row")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args(argv)
    measure("decode", 1024, args.device)  # warm-up: first calls pay for imports and kernels
    rows = []
    print(f"{'series':>8} {'Nq':>7} {'Nk':>8} {'seconds':>9} {'peak MiB':>9} {'inputs MiB':>10}")
    for series in SERIES:
        longest = {"prefill": args.max_prefill, "decode": args.max_decode or args.max_n}.get(series, args.max_n)
        for n in lengths(longest):
            row = measure(series, n, args.device)
            rows.append(row)
            print(f"{series:>8} {row['n_q']:>7} {n:>8} {row['seconds']:>9.3f} {row['peak_mib']:>9.0f} "
                  f"{row['inputs_mib']:>10.0f}", flush=True)
            save(rows, args)  # after every row: a run stopped at its time limit keeps what it measured
    return rows


def save(rows: list[dict], args) -> None:
    if args.json:
        write_json(args.json, {"rows": rows, "torch": torch.__version__,
                               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None})
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
