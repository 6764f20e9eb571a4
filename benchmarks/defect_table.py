"""The defect models against the defects they must name, on this device: each model's planted bugs (flashcheck's
Triton kernel on its exposing input) and the real defects already classified in reports/ (tests/_defect_cases.py).
A row a defect: the model named, its fit against the model, the share of broken elements within one budget of
it, the kernel's err/budget against the oracle, and whether it is the expected model.

    python benchmarks/defect_table.py --device cuda [--only planted|real]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--only", choices=("planted", "real"), default=None)
    args = parser.parse_args(argv)
    _keep_nearest()
    jobs = []
    if args.only != "real":
        jobs += [(planted_row, model, bug) for model, bug in _planted()]
    if args.only != "planted":
        jobs += [(real_row, d) for d in _real() if args.device in d.devices]
    print(f"{'defect':<66} {'model named':<34} {'fit':>7} {'within':>6} {'oracle':>9} {'ok':>3} {'s':>5}", flush=True)
    rows = []
    for row, *what in jobs:  # each row as it comes: a call cut short keeps the rows it has
        r = row(*what, args.device)
        rows.append(r)
        print(f"{r['defect'][:66]:<66} {str(r['named'])[:34]:<34} {_num(r['fit']):>7} {_pct(r['within']):>6} "
              f"{_num(r['oracle']):>9} {r['ok']:>3} {r['seconds']:>5.1f}", flush=True)
        if r["ok"] == "no":  # what came nearest, to say why
            print("    " + r["line"] + "\n    nearest: " + "; ".join(_NEAREST), flush=True)
    missed = [r for r in rows if r["ok"] == "no"]
    print(f"{len(rows) - len(missed)} of {len(rows)} named as expected")
    return 1 if missed else 0


_NEAREST: list[str] = []


def _keep_nearest():
    """Record the three nearest fits of each matching, explaining or not (the library returns the first kind)."""
    from flashcheck.defects import matching

    rank = matching._rank

    def ranked(fits, tried, kernel_ratio):
        _NEAREST[:] = [f"{f.name} fit {_num(f.fit)} within {_pct(f.within)} model {_num(f.model_ratio)} twin "
                       f"{_num(f.twin_fit)} tile {f.tile}" for f in sorted(fits, key=lambda f: f.fit)[:3]]
        return rank(fits, tried, kernel_ratio)

    matching._rank = ranked


def _planted():
    from tests._defect_cases import planted
    return planted()


def _real():
    from tests._defect_cases import REAL
    return REAL


def planted_row(model: str, bug: str, device: str) -> dict:
    from tests._defect_cases import explain_planted

    start = time.perf_counter()
    explained = explain_planted(bug, device)
    best = explained.best
    return _row(f"flashcheck:triton~{bug}", explained, best is not None and best.model == model, start)


def real_row(defect, device: str) -> dict:
    from flashcheck.defects import explain

    start = time.perf_counter()
    if defect.needs and importlib.util.find_spec(defect.needs) is None:
        return {"defect": defect.label, "named": f"not run: no {defect.needs}", "fit": None, "within": None,
                "oracle": None, "ok": "-", "seconds": 0.0}
    case, do = defect.load(device)
    explained = explain(defect.kernel, case, device=device, do=do)
    return _row(f"{defect.label} ({defect.kernel})", explained, defect.matches(explained.named), start)


def _row(label: str, explained, ok: bool, start: float) -> dict:
    best = explained.best
    return {"defect": label, "named": explained.named or explained.note or "none", "fit": best and best.fit,
            "within": best and best.within, "oracle": explained.kernel_ratio, "ok": "yes" if ok else "no",
            "seconds": time.perf_counter() - start, "line": explained.line()}


def _num(x) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if x >= 1000 else f"{x:.3g}"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.0%}"


if __name__ == "__main__":
    raise SystemExit(main())
