"""Upstream reproducers of the defects flashcheck found in PyTorch and Triton, written and run without flashcheck.

For each entry of the catalogue (reports/upstream-2026-12-04/catalogue.toml) found on ``--device``:
1. OUTDIR/<slug>/ gets repro.py, repro.npz and ISSUE.md: ``flashcheck repro`` on the entry's saved case (in a
   subprocess, flashcheck from this checkout's src); or OUTDIR/<script>/ a copy of the entry's hand-written folder,
   one for every entry of that script (their outputs apart: output-<slug>.txt where the slug is not the folder's
   name);
2. repro.py runs in a subprocess where flashcheck cannot be imported: no src on PYTHONPATH, run from that folder,
   and ``python -c "import flashcheck"`` is shown to fail there first (where flashcheck is installed, a folder
   whose ``flashcheck`` package refuses to import goes on PYTHONPATH);
3. its exit status (1 reproduced, 0 not, 2 cannot run here), wall time and last lines are recorded.
The table goes to OUTDIR/table-<device>.md and .json, and is printed last.

Usage (repository root): python benchmarks/upstream_repros.py --device cuda|cpu --out OUTDIR [--only SLUG ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports" / "upstream-2026-12-04"
CATALOGUE = REPORTS / "catalogue.toml"
DEVICES = ("cuda", "cpu")
TAIL = 12  # lines of a script's output kept in the table's JSON
BLOCKER = 'raise ImportError("flashcheck is blocked here: the reproducer must run without it")\n'


def load_catalogue(path: Path = CATALOGUE) -> dict:
    """The catalogue: ``defect`` (entries) and ``skipped`` (rows with a reason), each a list of dicts."""
    data = tomllib.loads(Path(path).read_text())
    return {"defect": data.get("defect", []), "skipped": data.get("skipped", [])}


def entries(catalogue: dict, device: str, only=()) -> list[dict]:
    """The entries found on ``device``, or those named in ``only`` (an unknown name is an error)."""
    chosen = [e for e in catalogue["defect"] if e["device"] == device and (not only or e["slug"] in only)]
    unknown = set(only) - {e["slug"] for e in catalogue["defect"]}
    if unknown:
        raise SystemExit(f"--only: no catalogue entry {sorted(unknown)}; use slugs of {CATALOGUE.name}")
    return chosen


def _run(command: list, *, cwd: Path, env: dict, timeout: float) -> dict:
    """``command`` in a subprocess: exit status (124 after ``timeout``), seconds, output."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
        rc, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:  # its output so far comes as bytes, even with text=True
        so_far = b"".join(x if isinstance(x, bytes) else (x or "").encode() for x in (exc.stdout, exc.stderr))
        rc, output = 124, so_far.decode(errors="replace") + f"\n(timed out after {timeout:.0f} s)"
    return {"rc": rc, "seconds": round(time.perf_counter() - start, 2), "output": output}


def _flashcheck_env() -> dict:
    """This process's environment with this checkout's src first on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def generate(entry: dict, folder: Path, device: str, timeout: float) -> dict:
    """repro.py (with repro.npz) and ISSUE.md in ``folder``: ``flashcheck repro`` on the entry's case, or its
    hand-written ones."""
    folder.mkdir(parents=True, exist_ok=True)
    if "script" in entry:
        source = REPORTS / entry["script"]
        for name in ("repro.py", "ISSUE.md"):
            if (source / name).resolve() != (folder / name).resolve():
                shutil.copyfile(source / name, folder / name)
        return {"rc": 0, "seconds": 0.0, "output": f"hand-written: {source.relative_to(ROOT)}"}
    command = [sys.executable, "-m", "flashcheck.cli", "repro", str(ROOT / entry["case"]), "--out", str(folder),
               "--device", device]
    if "kernel" in entry:
        command += ["--kernel", entry["kernel"]]
    made = _run(command, cwd=ROOT, env=_flashcheck_env(), timeout=timeout)
    (folder / "repro-cli.txt").write_text(made["output"])
    return made


def clean_env(blocker: Path) -> dict:
    """An environment without flashcheck: no PYTHONPATH, and ``blocker`` on it where flashcheck is installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if _imports_flashcheck(env, Path(tempfile.gettempdir()))["rc"] == 0:
        (blocker / "flashcheck").mkdir(parents=True, exist_ok=True)
        (blocker / "flashcheck" / "__init__.py").write_text(BLOCKER)
        env["PYTHONPATH"] = str(blocker)
    return env


def _imports_flashcheck(env: dict, cwd: Path) -> dict:
    return _run([sys.executable, "-c", "import flashcheck"], cwd=cwd, env=env, timeout=60)


def run_script(folder: Path, env: dict, timeout: float, args=(), output: str = "output.txt") -> dict:
    """repro.py ``args`` in ``folder`` with ``env``, after the proof that flashcheck does not import there; what it
    prints goes to ``folder / output``."""
    proof = _imports_flashcheck(env, folder)
    if proof["rc"] == 0:
        raise SystemExit(f"flashcheck imports in {folder} with PYTHONPATH={env.get('PYTHONPATH')!r}: "
                         "the reproducer would not prove it runs without flashcheck; uninstall flashcheck")
    ran = _run([sys.executable, "repro.py", *args], cwd=folder, env=env, timeout=timeout)
    (folder / output).write_text(ran["output"])
    last = proof["output"].strip().splitlines()[-1:]
    return {**ran, "import_flashcheck": f"exit {proof['rc']}: {' '.join(last)}"}


def one(entry: dict, out: Path, device: str, env: dict, timeout: float) -> dict:
    """The entry's row: generated, then run (not run when generation failed). A hand-written script has one folder
    for all its entries (each device's, say): an entry named otherwise than its folder prints to output-<slug>.txt."""
    folder = out / entry.get("script", entry["slug"])
    output = "output.txt" if folder.name == entry["slug"] else f"output-{entry['slug']}.txt"
    row = {k: entry.get(k) for k in ("slug", "backend", "device", "case", "script", "kernel", "args", "expect")}
    made = generate(entry, folder, device, timeout)
    row["generate"] = {"rc": made["rc"], "seconds": made["seconds"], "tail": _tail(made["output"])}
    if made["rc"] != 0 or not (folder / "repro.py").is_file():
        return {**row, "exit": None, "reproduced": False}
    ran = run_script(folder, env, timeout, entry.get("args", ()), output)
    return {**row, "exit": ran["rc"], "seconds": ran["seconds"], "import_flashcheck": ran["import_flashcheck"],
            "tail": _tail(ran["output"]), "reproduced": ran["rc"] == entry["expect"]}


def _tail(text: str) -> list[str]:
    return [line[:300] for line in text.rstrip().splitlines()[-TAIL:]]


def markdown(rows: list[dict]) -> str:
    lines = ["| slug | backend | device | exit | expected | reproduced | seconds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r["exit"] if r["exit"] is not None else f"not written (repro exit {r['generate']['rc']})"
        lines.append(f"| {r['slug']} | `{r['backend']}` | {r['device']} | {status} | {r['expect']} | "
                     f"{'yes' if r['reproduced'] else 'no'} | {r.get('seconds', '-')} |")
    return "\n".join(lines) + "\n"


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", required=True, choices=DEVICES, help="the entries found on this device")
    parser.add_argument("--out", required=True, type=Path, help="OUTDIR: a folder per entry, and the table")
    parser.add_argument("--only", nargs="+", default=(), metavar="SLUG", help="only these entries")
    parser.add_argument("--jobs", type=int, default=1, help="entries at once (default 1)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each repro and each script")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.timeout <= 0:
        parser.error(f"--jobs {args.jobs} and --timeout {args.timeout}: both must be positive")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    chosen = entries(load_catalogue(), args.device, args.only)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, table = {}, write_table(args.out, args.device, [])
    with tempfile.TemporaryDirectory() as blocker:
        env = clean_env(Path(blocker))
        with ThreadPoolExecutor(args.jobs) as pool:
            running = {pool.submit(one, e, args.out, args.device, env, args.timeout): e["slug"] for e in chosen}
            for done in as_completed(running):
                rows[running[done]] = done.result()
                print(f"{running[done]}: exit {rows[running[done]]['exit']}", flush=True)
                # Rewritten after each entry: a run stopped by its time limit keeps the rows it finished.
                table = write_table(args.out, args.device, [rows[e["slug"]] for e in chosen if e["slug"] in rows])
    print(table, end="")
    return 0 if all(r["reproduced"] for r in rows.values()) else 1


def write_table(out: Path, device: str, rows: list[dict]) -> str:
    table = markdown(rows)
    (out / f"table-{device}.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / f"table-{device}.md").write_text(table)
    return table


if __name__ == "__main__":
    sys.exit(main())
