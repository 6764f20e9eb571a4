"""Benchmark: the float64 oracle with its bound against a bare float64 softmax attention, same run.

CPU: numpy float64 (one head, N = 4096, D = 128, fp16 inputs by default).
GPU (--device cuda): torch float64, B = 1, H = 16, N = 4096, D = 128.
Prints one table; ratios are taken within the run, since these machines are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from flashcheck import reference_attention
from flashcheck.files import write_json


def bare_numpy(q, k, v, scale):
    """The cheapest honest float64 attention: no bound, no mask handling."""
    Q, K, V = (t.double().numpy() for t in (q[0, 0], k[0, 0], v[0, 0]))
    s = (Q @ K.T) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p @ V) / p.sum(axis=1, keepdims=True)


def bare_torch(q, k, v, scale):
    s = torch.matmul(q.double(), k.double().transpose(-1, -2)) * scale
    p = torch.exp(s - s.amax(dim=-1, keepdim=True))
    return torch.matmul(p, v.double()) / p.sum(dim=-1, keepdim=True)


def timed(fn, repeats, sync=lambda: None):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", action="store_true",
                        help="also print each side's costliest operators and its device-busy share")
    args = parser.parse_args(argv)
    heads = args.heads or (1 if args.device == "cpu" else 16)
    gen = torch.Generator().manual_seed(0)
    shape = (1, heads, args.n, args.d)
    q, k, v = (torch.randn(shape, generator=gen).to(torch.float16).to(args.device) for _ in range(3))
    scale = args.d ** -0.5
    if args.device == "cuda":
        sync = torch.cuda.synchronize
        bare = lambda: bare_torch(q, k, v, scale)  # noqa: E731
    else:
        sync = lambda: None  # noqa: E731
        bare = lambda: bare_numpy(q, k, v, scale)  # noqa: E731
    oracle = lambda: reference_attention(q, k, v, scale=scale)  # noqa: E731
    bare(); oracle()  # warm-up
    # Interleave so drift in machine load hits both equally.
    t_bare, t_oracle = [], []
    for _ in range(args.repeats):
        t_bare.append(timed(bare, 1, sync))
        t_oracle.append(timed(oracle, 1, sync))
    mb, mo = statistics.median(t_bare), statistics.median(t_oracle)
    row = {"device": args.device, "B": 1, "H": heads, "N": args.n, "D": args.d,
           "bare_s": mb, "oracle_s": mo, "ratio": mo / mb, "torch_threads": torch.get_num_threads()}
    print(f"{'device':>6} {'H':>3} {'N':>6} {'D':>4} {'bare (s)':>10} {'oracle+bound (s)':>17} {'ratio':>6}")
    print(f"{args.device:>6} {heads:>3} {args.n:>6} {args.d:>4} {mb:>10.4f} {mo:>17.4f} {mo / mb:>6.2f}")
    if args.profile:
        for name, fn in (("bare", bare), ("oracle", oracle)):
            row[f"{name}_profile"] = profile_table(name, fn, sync, args.device)
    if args.json:
        write_json(args.json, row)
    return row


def profile_table(name, fn, sync, device):
    """Print the operators that cost ``fn`` most, and how much of its wall time the device was busy."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    sync()
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        fn()
        sync()
    wall = time.perf_counter() - t0
    key = "self_cpu_time_total"
    if device == "cuda":  # named self_cuda_time_total before torch 2.4
        key = next(k for k in ("self_device_time_total", "self_cuda_time_total") if hasattr(prof.key_averages()[0], k))
    averages = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)
    busy = sum(getattr(e, key, 0) for e in averages) / 1e6
    print(f"--- {name}: wall {wall * 1e3:.1f} ms, {'device' if device == 'cuda' else 'cpu'} self time {busy * 1e3:.1f} ms")
    rows = []
    for e in averages[:12]:
        rows.append({"op": e.key, "calls": e.count, "ms": getattr(e, key, 0) / 1e3})
        print(f"  {e.key[:70]:<70} {e.count:>5} {getattr(e, key, 0) / 1e3:>9.2f} ms")
    return {"wall_s": wall, "busy_s": busy, "top": rows}


if __name__ == "__main__":
    main()
