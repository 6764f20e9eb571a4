"""Benchmark: what judging one case costs as its work grows 10x, 100x and 1000x, against the kernel's own time.

Three axes grow from one base case (fp16, Hq = Hkv, Nq = Nk = 128 unless grown, D = 64, causal none): the keys
(Nk = 128 x factor, Nq = 128), the batch (B = factor) and the heads (Hq = Hkv = factor), each by the factors of
--factors (default 1, 10, 100, 1000). Each row draws its case on the device (as a GPU campaign does), then times
the kernel alone (the fastest of --repeats calls) and one `flashcheck.check` with every exact property and the
envelope (the verdict's own split: oracle and budget, properties, envelope), and the peak device memory each
adds above the case's inputs (torch's allocator on a GPU; tracemalloc's peak on the CPU, which sees numpy's
arrays, not torch's). A row whose case or oracle does not fit says so and the axis stops there.

    python benchmarks/bench_work.py --device cuda --kernel torch:flash --json work.json
    python benchmarks/bench_work.py --device cpu --kernel torch:math --factors 1,10 --base-n 32
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import torch

import flashcheck
from flashcheck.contract.validation import Shapes
from flashcheck.files import write_json
from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.check import run_kernel
from flashcheck.kernels.registry import resolve_kernel

AXES = ("keys", "batch", "heads")


def grown(axis: str, factor: int, base_n: int, head_dim: int) -> Shapes:
    """The base case (B = H = 1, Nq = Nk = base_n) with ``axis`` grown ``factor`` times (Hq = Hkv)."""
    if axis == "keys":
        return Shapes(1, 1, 1, base_n, base_n * factor, head_dim, head_dim)
    if axis == "batch":
        return Shapes(factor, 1, 1, base_n, base_n, head_dim, head_dim)
    return Shapes(1, factor, factor, base_n, base_n, head_dim, head_dim)


def elements(s: Shapes) -> int:
    """Score elements: the work of one attention call."""
    return s.batch * s.heads_q * s.n_q * s.n_k


def drawn(s: Shapes, device: str) -> AttentionCase:
    gen = torch.Generator(device=device).manual_seed(elements(s))
    q, k, v = (torch.randn(s.batch, heads, n, s.head_dim, generator=gen, device=device, dtype=torch.float16)
               for heads, n in ((s.heads_q, s.n_q), (s.heads_kv, s.n_k), (s.heads_kv, s.n_k)))
    return AttentionCase.create(q, k, v, scale=s.head_dim ** -0.5)


class Peak:
    """The peak memory a block adds above what was allocated when it began, in MiB."""

    def __init__(self, device: str):
        self.device, self.mib = device, 0.0

    def __enter__(self):
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.base = torch.cuda.memory_allocated()
        else:
            tracemalloc.start()
        return self

    def __exit__(self, *exc):
        if self.device == "cuda":
            torch.cuda.synchronize()
            self.mib = (torch.cuda.max_memory_allocated() - self.base) / 2**20
        else:
            self.mib = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()


def kernel_time(kernel, case: AttentionCase, device: str, repeats: int) -> tuple[float, float]:
    """(the fastest call's seconds, its peak MiB above the inputs)."""
    q, k, v, mask = case.to_device(device)
    best, peak = float("inf"), 0.0
    for _ in range(repeats):
        with Peak(device) as p:
            run = run_kernel(kernel, q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask)
        if run.error is not None:
            raise run.error
        best, peak = min(best, run.seconds), max(peak, p.mib)
    return best, peak


def measure(kernel, axis: str, factor: int, args) -> dict:
    shape = grown(axis, factor, args.base_n, args.head_dim)
    row = {"axis": axis, "factor": factor, "batch": shape.batch, "heads": shape.heads_q, "n_q": shape.n_q,
           "n_k": shape.n_k, "head_dim": shape.head_dim, "elements": elements(shape), "device": args.device}
    case = drawn(shape, args.device)
    row["inputs_mib"] = sum(t.numel() * t.element_size() for t in (case.q, case.k, case.v)) / 2**20
    row["kernel_s"], row["kernel_peak_mib"] = kernel_time(kernel, case, args.device, args.repeats)
    start = time.perf_counter()
    with Peak(args.device) as p:
        verdict = flashcheck.check(kernel, case, device=args.device)
    row["case_s"] = time.perf_counter() - start
    row["case_peak_mib"] = p.mib
    row["status"] = verdict.status
    row["skipped"] = verdict.skipped
    row.update({f"{part}_s": verdict.elapsed.get(part, 0.0) for part in ("oracle", "properties", "envelope")})
    row["case_over_kernel"] = row["case_s"] / row["kernel_s"] if row["kernel_s"] > 0 else None
    return row


def run_axis(kernel, axis: str, args) -> list[dict]:
    rows = []
    for factor in args.factors:
        try:
            row = measure(kernel, axis, factor, args)
        except torch.cuda.OutOfMemoryError as exc:
            rows.append({"axis": axis, "factor": factor, "device": args.device, "error": f"out of memory: {exc}"[:160]})
            break
        finally:
            if args.device == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        if row["skipped"]:
            break
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'axis':<6} {'x':>5} {'B':>5} {'H':>5} {'Nq':>5} {'Nk':>7} {'kernel ms':>10} {'case ms':>10} "
            f"{'case/kernel':>11} {'oracle':>8} {'props':>8} {'envel.':>8} {'kernel MiB':>10} {'case MiB':>9} "
            f"{'inputs':>8}  verdict")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['axis']:<6} {r['factor']:>5}  {r['error']}")
            continue
        ratio = f"{r['case_over_kernel']:.1f}" if r["case_over_kernel"] else "-"
        lines.append(
            f"{r['axis']:<6} {r['factor']:>5} {r['batch']:>5} {r['heads']:>5} {r['n_q']:>5} {r['n_k']:>7} "
            f"{r['kernel_s'] * 1e3:>10.2f} {r['case_s'] * 1e3:>10.1f} {ratio:>11} {r['oracle_s'] * 1e3:>8.1f} "
            f"{r['properties_s'] * 1e3:>8.1f} {r['envelope_s'] * 1e3:>8.1f} {r['kernel_peak_mib']:>10.1f} "
            f"{r['case_peak_mib']:>9.1f} {r['inputs_mib']:>8.1f}  {r['skipped'] or r['status']}")
    lines.append("(ms of one case; case: flashcheck.check with every exact property and the envelope; oracle, "
                 "props, envel.: its parts; MiB: the peak each adds above the inputs)")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--kernel", default=None, help="default: torch:flash on cuda, torch:math on the CPU")
    parser.add_argument("--factors", default="1,10,100,1000", type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--axes", default=",".join(AXES), type=lambda s: s.split(","))
    parser.add_argument("--base-n", type=int, default=128)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    name = args.kernel or ("torch:flash" if args.device == "cuda" else "torch:math")
    kernel = resolve_kernel(name, device=args.device)
    measure(kernel, "keys", 1, args)  # warm: the first call loads the device's libraries
    rows = [row for axis in args.axes for row in run_axis(kernel, axis, args)]
    print(f"{kernel.name} on {args.device}" + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else ""))
    print(table(rows))
    if args.json:
        write_json(args.json, {"kernel": kernel.name, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
