"""Two or more reports side by side: two runs, two kernels, two versions of a library.

Rows are matched by what they are about (a kernel, pass and dtype; a distinct bug's kernel, pass and
cause; a value regime), so a bug that appears or goes away between versions shows as a row with a gap.
"""

from __future__ import annotations

import math
from pathlib import Path

from .plots import plots
from .render import NO_GPU, ratio_text, write_pages

__all__ = ["compare_blocks", "write_comparison"]


def _runs(reports: list[dict], names: list[str]) -> list:
    rows = []
    for name, r in zip(names, reports):
        m, fc = r["machine"], r["flashcheck"]
        gpus = ", ".join(g["name"] for g in m["gpus"]) or NO_GPU
        rows.append([name, r["status"], r["created"], (fc["commit"] or "-")[:12], m["torch"], m["cuda"] or "-",
                     m["cudnn"] or "-", m["triton"] or "-", gpus, r["totals"]["judged"], r["totals"]["bugs"]])
    return [("h2", "Runs"), ("table", ["report", "status", "created", "flashcheck", "torch", "CUDA", "cuDNN",
                                       "triton", "GPU", "judged", "bugs"], rows)]


def _verdicts(reports: list[dict], names: list[str]) -> list:
    cells = [{(c["kernel"], c["pass"], x["dtype"]): x for c in r["campaigns"] for x in c["dtypes"]} for r in reports]
    keys = list(dict.fromkeys(k for table in cells for k in table))
    rows = [list(k) + [_cell(table.get(k)) for table in cells] for k in keys]
    return [("h2", "Verdicts side by side"), ("table", ["kernel", "pass", "dtype"] + names, rows)]


def _cell(cell: dict | None) -> str:
    if cell is None:
        return "not run"
    return f"{cell['status']} ({cell['judged']} cases, max {ratio_text(cell['max_ratio'])})"


def _bugs(reports: list[dict], names: list[str]) -> list:
    tables = [{(b["kernel"], b["pass"], b["cause"]): b for b in r["bugs"]} for r in reports]
    keys = list(dict.fromkeys(k for table in tables for k in table))
    if not keys:
        return [("h2", "Distinct bugs side by side"), ("p", "No report found a bug.")]
    rows = []
    for k in keys:
        title = next(t[k]["title"] for t in tables if k in t)
        rows.append(list(k) + [title] + [f"{t[k]['status']} #{t[k]['id']}, {t[k]['cases']} cases" if k in t
                                         else "absent" for t in tables])
    return [("h2", "Distinct bugs side by side"), ("table", ["kernel", "pass", "cause", "what"] + names, rows)]


def _worst_by_regime(report: dict) -> dict:
    c = {name: i for i, name in enumerate(report["cases"]["columns"])}
    worst: dict = {}
    for r in report["cases"]["rows"]:
        x = math.inf if isinstance(r[c["ratio"]], str) else r[c["ratio"]]
        if x is not None:
            worst[r[c["values"]]] = max(worst.get(r[c["values"]], 0.0), x)
    return worst


def _regimes(reports: list[dict], names: list[str]) -> list:
    worst = [_worst_by_regime(r) for r in reports]
    regimes = sorted({k for w in worst for k in w})
    rows = [[g] + [("non-finite" if math.isinf(w[g]) else f"{w[g]:.3g}") if g in w else "-" for w in worst]
            for g in regimes]
    return [("h2", "Worst err/budget per value regime, all kernels"), ("table", ["value regime"] + names, rows)]


def compare_blocks(reports: list[dict], names: list[str], plot_lists: list[list]) -> tuple[list, list]:
    """The comparison's blocks, and the plots they show (each report's heat map, renamed per report)."""
    shown, blocks = [], []
    for i, (name, plot_list) in enumerate(zip(names, plot_lists)):
        for plot_name, title, png in plot_list:
            if plot_name == "worst-heatmap":
                shown.append((f"{plot_name}-{i + 1}", f"{name}: {title}", png))
    blocks += [("h1", "flashcheck reports side by side: " + " | ".join(names))]
    blocks += _runs(reports, names) + _verdicts(reports, names) + _bugs(reports, names) + _regimes(reports, names)
    blocks += [("h2", "Plots")] + [("img", n, t) for n, t, _ in shown]
    return blocks, shown


def write_comparison(reports: list[dict], names: list[str], out) -> None:
    """``compare.md``, ``compare.html`` and their plots in ``out``."""
    blocks, shown = compare_blocks(reports, names, [plots(r) for r in reports])
    write_pages(blocks, shown, Path(out), stem="compare", title="flashcheck reports side by side")
