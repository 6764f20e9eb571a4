"""The sign-off report as data: ``report.json``, built from the campaigns' summaries (schema: ``schema.json``).

Per kernel, pass (forward, backward) and dtype, a cell is SIGNED-OFF or BLOCKED, with its reasons: each
distinct bug that hit that dtype, too few judged cases, a campaign that stopped early. Cases a kernel's
spec excludes (documented defects and conventions) are listed as the conditions of a sign-off, not
counted as judged. The report keeps one row per judged case, so that it can be re-rendered and
compared without the campaigns.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
from collections import Counter
from pathlib import Path

from ..campaign.result import RECORD_COLUMNS, never_judged
from ..errors import InvalidArgument
from ..files import replay_command
from ..judge.verdict import BUG, from_json_number
from .confidence import anchor_table, confidence, drew, thin_regimes
from ..words import counted

__all__ = ["BLOCKED", "SCHEMA_VERSION", "SIGNED_OFF", "build_report", "load_report", "schema"]

SCHEMA_VERSION = 1
SIGNED_OFF, BLOCKED = "SIGNED-OFF", "BLOCKED"
CASE_COLUMNS = ("kernel", "pass") + RECORD_COLUMNS
AXES = ("values", "mask", "causal", "layout", "dtype")  # the coverage matrix's axes
_STOPPED_EARLY = ("worker_failed", "worker_died", "interrupted")
_DTYPE, _RATIO, _VALUES = (RECORD_COLUMNS.index(c) for c in ("dtype", "ratio", "values"))


def schema() -> dict:
    """The JSON Schema of ``report.json``."""
    return json.loads((Path(__file__).parent / "schema.json").read_text())


def load_report(directory) -> dict:
    """The report in ``directory`` (its ``report.json``); :class:`InvalidArgument` if there is none."""
    path = Path(directory) / "report.json"
    fix = "Pass a folder written by `flashcheck signoff --out DIR`."
    try:
        report = json.loads(path.read_text())
    except OSError as exc:
        raise InvalidArgument("report", str(directory), f"has no readable report.json ({exc.strerror or exc})",
                              fix) from None
    except ValueError as exc:
        raise InvalidArgument("report", str(directory), f"report.json is not JSON ({exc})", fix) from None
    if not isinstance(report, dict) or report.get("schema") != "flashcheck-report":
        raise InvalidArgument("report", str(directory), "report.json is not a flashcheck sign-off report", fix)
    if report.get("schema_version") != SCHEMA_VERSION:
        raise InvalidArgument("report", str(directory), f"report.json has schema_version "
                              f"{report.get('schema_version')!r}; this flashcheck reads {SCHEMA_VERSION}",
                              "Re-run the sign-off with this flashcheck, or use the version that wrote it.")
    return report


def _relative(path: str | None, root: Path) -> str | None:
    """``path`` relative to the report's folder when it lies inside it (the report can move)."""
    if not path:
        return path
    try:
        return os.path.relpath(Path(path).resolve(), root.resolve()) if \
            Path(path).resolve().is_relative_to(root.resolve()) else path
    except (OSError, ValueError):
        return path


def _max_ratio(values) -> float | None:
    ratios = [from_json_number(v) for v in values if v is not None]
    if not ratios:
        return None
    return math.nan if any(math.isnan(r) for r in ratios) else max(ratios)


def _cell(campaign: dict, dtype: str, rows: list, bugs: list, minimum: dict, coverage: dict,
          quantization: dict | None = None) -> dict:
    judged = [r for r in rows if r[_DTYPE] == dtype]
    hit = [b for b in bugs if b["dtypes"].get(dtype)]
    reasons = [f"{b['status']} #{b['id']} [{b['cause']}] {b['title']} ({b['dtypes'][dtype]} {dtype} cases)"
               for b in hit]
    if len(judged) < minimum["cases"]:
        reasons.append(f"only {counted(len(judged), dtype + ' case')} judged, fewer than the {minimum['cases']} a "
                       "sign-off needs (raise --max-examples or --time-budget)")
    reasons += _thin_regimes(judged, rows, dtype, minimum["regime_cases"], coverage)
    stopped = campaign["stopped"] if isinstance(campaign["stopped"], list) else [campaign["stopped"]]
    early = [s for s in stopped if s in _STOPPED_EARLY]  # a merged campaign lists its workers' reasons
    if early:
        reasons.append(f"the campaign stopped early ({', '.join(early)})")
    ratio = _max_ratio(r[_RATIO] for r in judged)
    return {"dtype": dtype, "status": BLOCKED if reasons else SIGNED_OFF, "reasons": reasons,
            "judged": len(judged), "bugs": [b["id"] for b in hit],
            "max_ratio": None if ratio is None else (ratio if math.isfinite(ratio) else str(ratio)),
            # the classes the cell never judged: what its sign-off rules nothing out about
            "never_judged": never_judged(coverage),
            "confidence": confidence(judged), "drew": drew(coverage), "anchors": anchor_table(judged),
            # the sampled cases' quantization error: a statement beside the verdict, never a reason in it
            **({"quantization_error": quantization} if quantization else {})}


def _thin_regimes(judged: list, rows: list, dtype: str, minimum: int | None, coverage: dict) -> list[str]:
    """One reason naming each value regime the campaign drew (that this dtype can draw) with fewer than
    ``minimum`` judged cases in this dtype, and its count: a rare regime is not signed off on a handful of cases."""
    if not minimum:
        return []
    drawn = {r[_VALUES] for r in rows} & set(coverage.get("values") or {r[_VALUES] for r in rows})
    thin = thin_regimes(judged, drawn, minimum)
    if not thin:
        return []
    return [f"{counted(len(thin), 'value regime')} with fewer {dtype} cases judged than the {minimum} "
            f"--min-regime-cases asks: {', '.join(f'{regime} {n}' for regime, n in thin)} "
            "(raise --max-examples or --time-budget)"]


def _campaign_entry(run: dict, root: Path, bugs: list, minimum: dict) -> dict:
    s = run["summary"]
    rows = s.get("records") or []
    skipped = s.get("skipped_reasons") or {}
    entry = {
        "kernel": s["kernel"], "pass": run["pass"], "verdict": s["verdict"], "stopped": s["stopped"],
        "cases": s["cases"], "examples": s["examples"], "judged": len(rows),
        "elapsed_s": s["elapsed_s"], "cases_per_s": s.get("cases_per_s"), "time_split_s": s["time_split_s"],
        "skipped": {k: n for k, n in s["skipped"].items() if n},
        "excluded": {k.split(":", 1)[1].strip(): n for k, n in skipped.items() if k.startswith("excluded:")},
        "not_judged": {k: n for k, n in skipped.items() if not k.startswith("excluded:")},
        "summary": _relative(run["summary_path"], root), "corpus": _relative(run["corpus"], root),
        "notes": list(s.get("notes") or []),
    }
    quantization = s.get("quantization_error") or {}
    entry["dtypes"] = [_cell(entry, d, rows, bugs, minimum, (s.get("coverage") or {}).get(d, {}), quantization.get(d))
                       for d in run["dtypes"]]
    return entry


def _bugs_of(run: dict, first_id: int, root: Path) -> list[dict]:
    out = []
    for i, bug in enumerate(run["summary"].get("bugs") or []):
        smallest = dict(bug.get("smallest") or {})
        if smallest:
            smallest["path"] = _relative(smallest.get("path"), root)
            smallest["replay"] = replay_command(smallest["path"], device=run["summary"].get("device"))
        out.append({**bug, "id": first_id + i, "kernel": run["summary"]["kernel"], "pass": run["pass"],
                    "smallest": smallest or None})
    return out


def coverage(rows: list) -> dict:
    """What the judged cases hit: counts per value of each axis, and value regime x mask regime."""
    at = {name: CASE_COLUMNS.index(name) for name in AXES}
    axes = {name: dict(Counter(r[i] for r in rows).most_common()) for name, i in at.items()}
    by_mask: dict = {}
    for r in rows:
        inner = by_mask.setdefault(r[at["values"]], {})
        inner[r[at["mask"]]] = inner.get(r[at["mask"]], 0) + 1
    combinations = len({tuple(r[i] for i in at.values()) for r in rows})
    return {"axes": axes, "values_by_mask": by_mask, "combinations": combinations}


def build_report(runs: list[dict], *, out: Path, meta: dict, min_cases: int,
                 min_regime_cases: int | None = None) -> dict:
    """The report of sign-off campaigns. Each run: ``{"pass", "dtypes", "summary", "summary_path",
    "corpus"}``; ``meta``: command, preset, seed, device, machine, flashcheck, not_checked.
    ``min_regime_cases``: judged cases each value regime a campaign drew needs per dtype (None: no minimum)."""
    bugs, campaigns, rows = [], [], []
    minimum = {"cases": min_cases, "regime_cases": min_regime_cases}
    for run in runs:
        mine = _bugs_of(run, len(bugs) + 1, out)
        bugs += mine
        campaigns.append(_campaign_entry(run, out, mine, minimum))
        rows += [[run["summary"]["kernel"], run["pass"], *r] for r in run["summary"].get("records") or []]
    cells = [c for entry in campaigns for c in entry["dtypes"]]
    status = SIGNED_OFF if cells and all(c["status"] == SIGNED_OFF for c in cells) else BLOCKED
    return {
        "schema": "flashcheck-report", "schema_version": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "status": status, "min_cases": min_cases, "min_regime_cases": min_regime_cases, **meta,
        "totals": {"campaigns": len(campaigns), "cases": sum(c["cases"] for c in campaigns), "judged": len(rows),
                   "bugs": len([b for b in bugs if b["status"] == BUG]),
                   "suspicious": len([b for b in bugs if b["status"] != BUG]),
                   "elapsed_s": round(sum(c["elapsed_s"] for c in campaigns), 3)},
        "campaigns": campaigns, "bugs": bugs, "coverage": coverage(rows),
        "cases": {"columns": list(CASE_COLUMNS), "rows": rows},
    }
