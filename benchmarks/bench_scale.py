"""Benchmark: cost as work grows. Campaigns of 1x, 10x, 100x and 1000x a base count of cases, and the steps
that run on their results afterwards, with the growth of each quantity from one scale to the next.

Each campaign is `flashcheck fuzz` as a user runs it: a fresh process, `--json` summary, `--no-progress`,
its own `--corpus` and `--database`, on the CPU with a cheap kernel and a small preset (written by this
script, see PRESET_TOML), so that 10,000 cases take minutes. Two kernels by default: `torch:math` (no bug:
the cost of judging alone) and `torch:varlen~reads_past_end` (a planted bug that fails most cases, with
`--keep-going`: the corpus, the distinct bugs and the findings grow with the cases). For each kernel and
scale it measures the campaign (wall seconds, cases/s, the summary's time split per case, peak RSS), the
corpus and the example database on disk, then `flashcheck merge` of the summary, and, for one kernel,
`flashcheck signoff` (which runs its own campaign: signoff and report take no fuzz summary) and
`flashcheck report` re-rendering the sign-off's report.json. Growth ratio = (q[i+1] / q[i]) / (s[i+1] / s[i])
between consecutive scales s: 1.0 is linear, above WORSE_THAN_LINEAR is flagged. Every row is written to
`--json` the moment it is measured, so a run cut short keeps what it measured.

    python benchmarks/bench_scale.py --json reports/scale-2026-12-03/scale.json
    python benchmarks/bench_scale.py --base 10 --scales 1,10,100 --kernel torch:math --no-signoff
    gunzip -k reports/scale-2026-12-03/scale.json.gz   # committed gzipped (reports/README.md)
    python benchmarks/bench_scale.py --table reports/scale-2026-12-03/scale.json
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
KERNELS = ("torch:math", "torch:varlen~reads_past_end")
SIGNOFF_KERNEL = "torch:varlen~reads_past_end"
# Above this a quantity grows worse than linearly. Between scales 10x apart, n log n growth from 1,000 to
# 10,000 gives log(10^4)/log(10^3) = 1.33 and run-to-run noise on a shared 2-core machine is about 10%, so
# 1.5 is past both: what stays above it is quadratic-ish, not noise or a log factor.
WORSE_THAN_LINEAR = 1.5
# The preset: one dtype, one head dim, lengths up to 16, so that a case costs tens of milliseconds on the
# CPU and 10,000 cases take a few minutes; every value, mask, scale regime and layout stays in.
PRESET_TOML = """\
description = "bench_scale: tiny CPU cases, every regime, fp32, lengths 1 to 16"
max_examples = 10
dtypes = ["fp32"]
min_n = 1
max_n = 16
max_batch = 2
max_heads = 2
head_dims = [16]
"""
MiB = 1024 * 1024
ENV = dict(os.environ)  # the campaigns' environment; --commit puts a copy of that commit's src/ first on the path


# ---------------------------------------------------------------------------------------------------------
# Options
# ---------------------------------------------------------------------------------------------------------


def positive_int(option: str, example: str = "10"):
    """An argparse type: a whole number of at least 1, else a message (after argparse's "argument OPTION:")
    echoing the value and saying the fix; argparse exits 2."""
    def parse(text: str) -> int:
        fix = f"pass a whole number of at least 1, e.g. {option} {example}"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; {fix}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value} is not a positive count; {fix}")
        return value
    return parse


def scale_list(text: str) -> list[int]:
    """``--scales``: comma-separated multipliers of ``--base``, each at least 1, increasing."""
    fix = "pass increasing whole numbers of at least 1, e.g. --scales 1,10,100,1000"
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} names no scale; {fix}")
    try:
        scales = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} holds a value that is not a whole number; {fix}") from None
    if any(s < 1 for s in scales):
        raise argparse.ArgumentTypeError(f"{text!r} holds a scale below 1 (zero or negative); {fix}")
    if any(b <= a for a, b in zip(scales, scales[1:])):
        raise argparse.ArgumentTypeError(f"{text!r} is not strictly increasing; {fix}")
    return scales


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=positive_int("--base"), default=10, help="cases at scale 1 (default 10)")
    parser.add_argument("--scales", type=scale_list, default=[1, 10, 100, 1000],
                        help="multipliers of --base, comma-separated (default 1,10,100,1000)")
    parser.add_argument("--kernel", action="append", default=None, metavar="NAME",
                        help=f"kernels to run, repeatable (default {', '.join(KERNELS)}); each with --keep-going")
    parser.add_argument("--signoff-kernel", default=SIGNOFF_KERNEL, metavar="NAME",
                        help=f"the kernel of the signoff/report rows (default {SIGNOFF_KERNEL})")
    parser.add_argument("--no-signoff", action="store_true", help="skip flashcheck signoff and flashcheck report")
    parser.add_argument("--isolation", action="store_true",
                        help="run the kernel in a worker process (default: --no-isolation, about 1.4x faster here)")
    parser.add_argument("--preset", default=None, metavar="PATH", help="a preset TOML (default: PRESET_TOML)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--commit", default=None, metavar="REV",
                        help="run a copy of REV's src/ (git archive), not the working tree's: edits in progress "
                             "stay out of the measurement")
    parser.add_argument("--work", default=None, metavar="DIR", help="corpora, databases, summaries (default: temp)")
    parser.add_argument("--json", default="bench_scale.json", metavar="PATH", help="the rows (default %(default)s)")
    parser.add_argument("--table", default=None, metavar="JSON", help="run nothing: print the table of a --json")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------------------
# Measuring one process
# ---------------------------------------------------------------------------------------------------------


def flashcheck_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "flashcheck.cli", *args]


def measured(cmd: list[str], log: Path) -> dict:
    """Run ``cmd`` to its end: exit status, wall and CPU seconds and peak RSS (MiB) of the process and the
    children it waited for (os.wait4's rusage is this child's alone, not the sum of every earlier one's).
    CPU seconds move less than wall seconds when other work shares the machine's cores."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE, env=ENV)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"rc": proc.returncode, "wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "max_rss_mib": round(usage.ru_maxrss * 1024 / MiB, 1),  # ru_maxrss is in KiB on Linux
            "load_1min": round(os.getloadavg()[0], 2)}  # other work on the machine, as it ended


def on_disk(path: Path) -> dict:
    """Bytes and files under ``path`` (0 and 0 where it does not exist)."""
    files = [p for p in path.rglob("*") if p.is_file()] if path.exists() else []
    return {"bytes": sum(p.stat().st_size for p in files), "files": len(files)}


def tail(log: Path, lines: int = 5) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


# ---------------------------------------------------------------------------------------------------------
# The steps of one row
# ---------------------------------------------------------------------------------------------------------


def campaign_step(kernel: str, cases: int, where: Path, opts) -> dict:
    """`flashcheck fuzz`, with what its summary says of the cases, the time split and the bugs."""
    summary_path = where / "summary.json"
    cmd = flashcheck_cmd("fuzz", kernel, "--device", opts.device, "--preset", str(opts.preset_path),
                         "--max-examples", str(cases), "--seed", str(opts.seed), "--keep-going", "--no-progress",
                         "--corpus", str(where / "corpus"), "--database", str(where / "database"),
                         "--json", str(summary_path), *([] if opts.isolation else ["--no-isolation"]))
    step = measured(cmd, where / "fuzz.log")
    if not summary_path.exists():
        return {**step, "error": tail(where / "fuzz.log")}
    s = json.loads(summary_path.read_text())
    split = s.get("time_split_s") or {}  # every part the summary has (its keys change as flashcheck does)
    return {**step, "verdict": s["verdict"], "examples": s["examples"], "judged": s["cases"],
            "elapsed_s": s["elapsed_s"], "first_case_s": s.get("first_case_s"), "stopped": s.get("stopped"),
            "cases_per_s": s.get("cases_per_s"), "steady_cases_per_s": s.get("steady_cases_per_s"),
            "split_s": dict(split),
            "bugs": len(s.get("bugs") or []), "bug_cases": sum(b.get("cases", 0) for b in s.get("bugs") or []),
            "findings": len(s.get("findings") or []), "summary_bytes": summary_path.stat().st_size,
            "summary": str(summary_path)}


def merge_step(summary: Path, where: Path) -> dict:
    """`flashcheck merge` of the campaign's summary (exit 0 or 1 is the verdict, not a failure)."""
    out = where / "merged.json"
    step = measured(flashcheck_cmd("merge", str(summary), "--json", str(out)), where / "merge.log")
    return step if out.exists() else {**step, "error": tail(where / "merge.log")}


def signoff_step(kernel: str, cases: int, where: Path, opts) -> dict:
    """`flashcheck signoff` of one kernel (its own keep-going campaign, then report.json, .md, .html, plots):
    signoff and report take no fuzz summary, so this is the way to their cost at this many cases."""
    out = where / "signoff"
    cmd = flashcheck_cmd("signoff", kernel, "--out", str(out), "--device", opts.device, "--preset",
                         str(opts.preset_path), "--max-examples", str(cases), "--seed", str(opts.seed),
                         "--min-cases", "1")  # 1: the smallest scales are not BLOCKED for too few cases alone
    step = measured(cmd, where / "signoff.log")
    report = out / "report.json"
    if not report.exists():
        return {**step, "error": tail(where / "signoff.log")}
    campaigns = [json.loads(p.read_text()) for p in sorted((out / "campaigns").glob("*.json"))]
    campaign_s = sum(c["elapsed_s"] for c in campaigns)
    return {**step, "campaign_s": round(campaign_s, 3), "outside_campaign_s": round(step["wall_s"] - campaign_s, 3),
            "report_json_bytes": report.stat().st_size, "dir": str(out)}


def report_step(signoff_dir: Path, where: Path) -> dict:
    """`flashcheck report DIR`: report.md, index.html and the plots rendered again from report.json."""
    step = measured(flashcheck_cmd("report", str(signoff_dir)), where / "report.log")
    return step if step["rc"] == 0 else {**step, "error": tail(where / "report.log")}


# ---------------------------------------------------------------------------------------------------------
# Rows, saved as they are measured
# ---------------------------------------------------------------------------------------------------------


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()


class Results:
    """The run's metadata and rows, rewritten to ``path`` (through a temp file) after every step."""

    def __init__(self, path: Path, meta: dict):
        self.path, self.data = path, {"meta": meta, "rows": []}
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1) + "\n")
        tmp.replace(self.path)

    def new_row(self, **fields) -> dict:
        self.data["rows"].append(dict(fields))
        self.save()
        return self.data["rows"][-1]

    def put(self, row: dict, name: str, value: dict) -> None:
        row[name] = value
        print(f"  {row['kernel']} x{row['scale']} {name}: {json.dumps(value)[:300]}", file=sys.stderr, flush=True)
        self.save()


def slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


def run_row(results: Results, kernel: str, scale: int, opts, *, signoff: bool) -> None:
    cases = opts.base * scale
    where = opts.work_dir / f"{slug(kernel)}-{cases}"
    row = results.new_row(kernel=kernel, scale=scale, cases=cases)
    results.put(row, "campaign", campaign_step(kernel, cases, where, opts))
    results.put(row, "corpus", on_disk(where / "corpus"))
    results.put(row, "database", on_disk(where / "database"))
    if "summary" in row["campaign"]:
        results.put(row, "merge", merge_step(Path(row["campaign"]["summary"]), where))
    if signoff:
        results.put(row, "signoff", signoff_step(kernel, cases, where, opts))
        if "dir" in row["signoff"]:
            results.put(row, "report", report_step(Path(row["signoff"]["dir"]), where))


# ---------------------------------------------------------------------------------------------------------
# Growth and the table
# ---------------------------------------------------------------------------------------------------------


def _get(row: dict, path: str):
    value = row
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _per_case(path: str):
    return lambda row: None if _get(row, path) is None else 1000 * _get(row, path) / row["cases"]


def _mib(path: str):
    return lambda row: None if _get(row, path) is None else _get(row, path) / MiB


# How a quantity's growth is computed (growth()): a total as (q[i+1] / q[i]) / (s[i+1] / s[i]); a per-case
# value as q[i+1] / q[i] (constant per case = linear); a rate (cases/s) by its cost per case, q[i] / q[i+1];
# CONTEXT is shown, not grown (the machine's load).
TOTAL, PER_CASE, RATE, CONTEXT = "total", "per case", "rate", "context"


def _above_smallest(rows: list[dict], path: str):
    """A row's ``path`` less its kernel's value at the smallest scale: what grows with the cases, without
    the fixed cost (imports, the oracle's warm-up) that every process pays."""
    first = {}
    for r in sorted(rows, key=lambda r: r["cases"]):
        first.setdefault(r["kernel"], _get(r, path))
    return lambda r: None if None in (_get(r, path), first[r["kernel"]]) else _get(r, path) - first[r["kernel"]]


def quantities(rows: list[dict]) -> list:
    """(label, value of a row, kind of growth). The parts of the time split are those the summaries have."""
    parts = list(dict.fromkeys(p for r in rows for p in (_get(r, "campaign.split_s") or {})))
    return [
        ("campaign wall s", lambda r: _get(r, "campaign.wall_s"), TOTAL),
        ("campaign CPU s", lambda r: _get(r, "campaign.cpu_s"), TOTAL),
        ("campaign wall ms/case", _per_case("campaign.wall_s"), PER_CASE),
        ("cases/s (summary)", lambda r: _get(r, "campaign.cases_per_s"), RATE),
        ("judged cases (incl. shrinking)", lambda r: _get(r, "campaign.judged"), TOTAL),
        *[(f"{part} ms/case", _per_case(f"campaign.split_s.{part}"), PER_CASE) for part in parts],
        ("campaign peak RSS MiB", lambda r: _get(r, "campaign.max_rss_mib"), TOTAL),
        ("campaign RSS above the smallest scale's MiB", _above_smallest(rows, "campaign.max_rss_mib"), TOTAL),
        ("load average (1 min) after the campaign", lambda r: _get(r, "campaign.load_1min"), CONTEXT),
        ("distinct bugs", lambda r: _get(r, "campaign.bugs"), TOTAL),
        ("cases in distinct bugs", lambda r: _get(r, "campaign.bug_cases"), TOTAL),
        ("findings (saved cases)", lambda r: _get(r, "campaign.findings"), TOTAL),
        ("summary JSON MiB", _mib("campaign.summary_bytes"), TOTAL),
        ("corpus MiB", _mib("corpus.bytes"), TOTAL),
        ("corpus files", lambda r: _get(r, "corpus.files"), TOTAL),
        ("database MiB", _mib("database.bytes"), TOTAL),
        ("database files", lambda r: _get(r, "database.files"), TOTAL),
        ("merge s", lambda r: _get(r, "merge.wall_s"), TOTAL),
        ("merge peak RSS MiB", lambda r: _get(r, "merge.max_rss_mib"), TOTAL),
        ("signoff wall s", lambda r: _get(r, "signoff.wall_s"), TOTAL),
        ("signoff CPU s", lambda r: _get(r, "signoff.cpu_s"), TOTAL),
        ("signoff outside its campaign s", lambda r: _get(r, "signoff.outside_campaign_s"), TOTAL),
        ("signoff peak RSS MiB", lambda r: _get(r, "signoff.max_rss_mib"), TOTAL),
        ("report.json MiB", _mib("signoff.report_json_bytes"), TOTAL),
        ("report s", lambda r: _get(r, "report.wall_s"), TOTAL),
        ("report peak RSS MiB", lambda r: _get(r, "report.max_rss_mib"), TOTAL),
    ]


def growth(a: float | None, b: float | None, scale_ratio: float, kind: str) -> float | None:
    """The growth ratio from ``a`` to ``b`` (1.0 linear); None where either is missing or zero, or for CONTEXT."""
    if not a or not b or kind == CONTEXT:
        return None
    return {TOTAL: b / a / scale_ratio, PER_CASE: b / a, RATE: a / b}[kind]


def growth_table(rows: list[dict]) -> dict:
    """{kernel: {label: [growth between scale i and i+1, ...]}} over each kernel's rows in scale order."""
    out = {}
    for kernel in dict.fromkeys(r["kernel"] for r in rows):
        mine = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["scale"])
        out[kernel] = {label: [growth(f(a), f(b), b["cases"] / a["cases"], kind)
                               for a, b in zip(mine, mine[1:])] for label, f, kind in quantities(rows)}
    return out


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer() and abs(value) >= 100:
        return f"{int(value):,}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _ratio_cell(value) -> str:
    if value is None:
        return "-"
    return f"**{value:.2f}**" if value > WORSE_THAN_LINEAR else f"{value:.2f}"


def markdown(rows: list[dict]) -> str:
    """One table per kernel: each quantity at each scale, then its growth between consecutive scales."""
    blocks, ratios = [], growth_table(rows)
    for kernel, by_label in ratios.items():
        mine = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["scale"])
        head = ["quantity", *[f"{r['cases']:,} cases" for r in mine],
                *[f"growth {a['cases']:,}→{b['cases']:,}" for a, b in zip(mine, mine[1:])]]
        lines = [f"### {kernel}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for label, f, _ in quantities(rows):
            values = [f(r) for r in mine]
            if all(v is None for v in values):
                continue
            lines.append("| " + " | ".join([label, *map(_cell, values), *map(_ratio_cell, by_label[label])]) + " |")
        blocks.append("\n".join(lines))
    note = (f"Growth: (q[i+1] / q[i]) / (cases[i+1] / cases[i]) for totals, q[i+1] / q[i] for per-case values "
            f"and for cases/s its cost per case; 1.00 is linear, **bold** above {WORSE_THAN_LINEAR} (worse than "
            "linear); '-' where a value is missing or zero, and for the load average (context only).")
    return "\n\n".join(blocks + [note])


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------


def usage_error(message: str) -> None:
    """Exit 2, as argparse does for a bad option."""
    print(f"bench_scale.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def use_commit(full: str, work: Path) -> None:
    """Export commit ``full``'s src/ and strategies/ into ``work``; put that src/ first on the campaigns' path."""
    copy = work / f"src-{full[:10]}"
    if not copy.exists():
        copy.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", full, "src", "strategies"], cwd=HERE, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(copy)], input=archive, check=True)
    ENV["PYTHONPATH"] = str(copy / "src")  # ahead of the editable install's finder, which comes last
    ENV["FLASHCHECK_SOURCE_COMMIT"] = full  # the sign-off report's commit: the copy has no .git


def prepare(opts) -> None:
    """Refuse a --preset or --signoff-kernel that cannot be used, before anything runs; then the work folder
    and the preset file."""
    opts.kernels = opts.kernel or list(KERNELS)
    if not opts.no_signoff and opts.signoff_kernel not in opts.kernels:
        usage_error(f"--signoff-kernel {opts.signoff_kernel!r} is not among the kernels run "
                    f"({', '.join(opts.kernels)}); name it with --kernel too, or pass --no-signoff")
    if opts.preset is not None and not Path(opts.preset).is_file():
        usage_error(f"--preset {opts.preset!r} is not a file; pass a preset TOML's path")
    full = opts.commit and git("rev-parse", "--verify", "--quiet", f"{opts.commit}^{{commit}}")
    if opts.commit is not None and not full:
        usage_error(f"--commit {opts.commit!r} is not a commit of {HERE}; pass one git rev-parse knows, e.g. HEAD")
    opts.work_dir = Path(opts.work or tempfile.mkdtemp(prefix="bench_scale-")).resolve()
    opts.work_dir.mkdir(parents=True, exist_ok=True)
    if opts.commit is not None:
        use_commit(full, opts.work_dir)
    opts.preset_path = Path(opts.preset).resolve() if opts.preset else opts.work_dir / "bench_scale.toml"
    if opts.preset is None:
        opts.preset_path.write_text(PRESET_TOML)


def meta(opts, argv) -> dict:
    commit = git("rev-parse", "--short", opts.commit or "HEAD")
    changed = [] if opts.commit else git("status", "--short", "--", "src").splitlines()  # measured with the run
    return {"command": " ".join(["python", "benchmarks/bench_scale.py", *argv]), "commit": commit,
            "src": ENV.get("PYTHONPATH", str(HERE / "src")), "src_changed_since_commit": changed,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "base": opts.base, "scales": opts.scales,
            "kernels": opts.kernels, "signoff_kernel": None if opts.no_signoff else opts.signoff_kernel,
            "isolation": "worker" if opts.isolation else "in-process (--no-isolation)", "seed": opts.seed,
            "device": opts.device, "preset": opts.preset_path.read_text(), "work": str(opts.work_dir),
            "python": sys.version.split()[0], "cpus": os.cpu_count()}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    opts = parse_args(argv)
    if opts.table:
        print(markdown(json.loads(Path(opts.table).read_text())["rows"]))
        return 0
    prepare(opts)
    results = Results(Path(opts.json), meta(opts, argv))
    print(f"bench_scale: work in {opts.work_dir}, rows in {opts.json}", file=sys.stderr)
    for scale in opts.scales:
        for kernel in opts.kernels:
            run_row(results, kernel, scale, opts, signoff=not opts.no_signoff and kernel == opts.signoff_kernel)
    results.data["growth"] = growth_table(results.data["rows"])
    results.data["meta"]["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results.save()
    print(markdown(results.data["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
