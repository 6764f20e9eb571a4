"""Compare two self-test runs (`flashcheck selftest --json`, .json or .json.gz; several files a side for a run
written in shards): planted bugs caught, correct cases and false alarms on each side, then row by row the first
case that caught each planted bug and how, leaving out rows a deadline stopped before their first catch on
either side (their count is not the code's doing).

    python benchmarks/compare_selftests.py before/selftest_*.json -- after/selftest_*.json
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def rows(paths: list[str]) -> dict:
    out = {}
    for p in paths:
        opener = gzip.open if p.endswith(".gz") else open
        with opener(p, "rt") as f:
            for r in json.load(f):
                out[(r["variant"], r["dtype"])] = r
    return out


def totals(side: dict) -> str:
    bugs = [r for r in side.values() if not r["correct"]]
    good = [r for r in side.values() if r["correct"]]
    caught = sum(r["flashcheck"]["first_case"] is not None for r in bugs)
    stopped = sum(r["stopped"] and r["flashcheck"]["first_case"] is None for r in bugs)
    alarms = sum(r["flashcheck"]["false_alarms"] + r["suspicious"] for r in good)
    worst = {}
    for r in good:
        if isinstance(r["max_ratio"], (int, float)):
            worst[r["dtype"]] = max(worst.get(r["dtype"], 0.0), r["max_ratio"])
    ratios = ", ".join(f"{d} {v:.3g}" for d, v in sorted(worst.items()))
    return (f"planted bugs caught {caught} of {len(bugs)} ({stopped} stopped by the deadline first); correct rows "
            f"{len(good)}, cases {sum(r['cases'] for r in good)}, false alarms or suspicious {alarms}; "
            f"largest err/budget {ratios}")


def main(argv: list[str]) -> int:
    if "--" not in argv:
        print(__doc__)
        return 2
    cut = argv.index("--")
    before, after = rows(argv[:cut]), rows(argv[cut + 1:])
    print("before:", totals(before))
    print("after: ", totals(after))
    same = same_case = compared = 0
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        if b["correct"]:
            continue
        fb, fa = b["flashcheck"], a["flashcheck"]
        cut_short = (b["stopped"] and fb["first_case"] is None) or (a["stopped"] and fa["first_case"] is None)
        if cut_short:
            continue
        compared += 1
        same_case += fb["first_case"] == fa["first_case"]
        if (fb["first_case"], fb["how"]) == (fa["first_case"], fa["how"]):
            same += 1
        else:
            print(f"  {key[0]} {key[1]}: case {fb['first_case']} ({fb['how']}) before, {fa['first_case']} ({fa['how']}) after")
    print(f"planted-bug rows no deadline cut on either side: {compared}; the same first catching case: {same_case}; "
          f"the same case and findings: {same}")
    only = sorted(set(before) ^ set(after))
    if only:
        print("rows on one side only:", ", ".join(f"{v} {d}" for v, d in only))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
