"""What the pages and plots say is true: no None or nan in the text, no CPU named as a GPU, no tiny ratio
labelled as 1e-4 and no huge finite one as NaN."""

from __future__ import annotations

import copy
import math
import re

import pytest

from flashcheck.report.compare import compare_blocks
from flashcheck.report.render import report_blocks, to_markdown

from ._committed import committed_report

# None anywhere, and nan or inf as a value: a table cell, or a ratio after "max" (prose such as a
# diagnosis's "dq is nan where the exact gradient is finite" says what happened, truthfully)
LEAK = re.compile(r"\bNone\b(?! found\.)|(?:^|\| |max )-?(?:nan|inf)(?: \||\)|$)")


def _leaks(markdown: str) -> list[str]:
    # replay commands are left as they are: they hold paths, not values
    return [line for line in markdown.splitlines() if LEAK.search(line) and "flashcheck replay" not in line]


def _markdown(report: dict) -> str:
    return to_markdown(report_blocks(report, []))


def _compare_markdown(reports: list[dict]) -> str:
    blocks, _ = compare_blocks(reports, [f"run{i}" for i in range(len(reports))], [[] for _ in reports])
    return to_markdown(blocks)


def _unknowns(report: dict) -> dict:
    """``report`` with every value a report may leave unknown or non-finite set so."""
    r = copy.deepcopy(report)
    r["seed"] = None
    r["flashcheck"].update(version=None, commit=None)
    r["campaigns"][0]["cases_per_s"] = None
    r["campaigns"][0]["dtypes"][0]["max_ratio"] = "nan"
    r["campaigns"][-1]["dtypes"][-1]["max_ratio"] = None
    r["bugs"][0]["max_ratio"] = "inf"
    r["cases"]["rows"][0][11] = "nan"
    return r


def test_no_seed_is_said_as_such(signoff_report):
    report = copy.deepcopy(signoff_report[2])
    assert "seed 1," in _markdown(report)
    report["seed"] = None
    md = _markdown(report)
    assert "seed None" not in md and "no seed" in md


def test_unknown_and_non_finite_values_never_show_as_none_or_nan(signoff_report):
    report = _unknowns(signoff_report[2])
    md, compared = _markdown(report), _compare_markdown([report, signoff_report[2]])
    assert _leaks(md) == [] and _leaks(compared) == []
    assert "non-finite" in md and "non-finite" in compared


@pytest.mark.parametrize("folder", ["signoff-h200-2026-12-01", "signoff-h200-2026-12-01-run1"])
def test_committed_reports_render_without_leaks(folder):
    report = committed_report(folder)
    assert _leaks(_markdown(report)) == []


def _gpu_column(markdown: str) -> list[str]:
    lines = [line for line in markdown.splitlines() if line.startswith("| ")]
    header = next(line for line in lines if "| GPU |" in line)
    at = [c.strip() for c in header.strip("|").split("|")].index("GPU")
    rows = lines[lines.index(header) + 1:]
    return [[c.strip() for c in row.strip("|").split("|")][at] for row in rows if row.startswith("| run")][:2]


def test_compare_says_a_cpu_run_had_no_gpu(signoff_report):
    cpu = copy.deepcopy(signoff_report[2])
    assert cpu["machine"]["gpus"] == []
    gpu = copy.deepcopy(cpu)
    gpu["machine"]["gpus"] = [{"name": "NVIDIA H200", "memory_gib": 139.8, "capability": "9.0"}]
    assert _gpu_column(_compare_markdown([cpu, gpu])) == ["none (CPU)", "NVIDIA H200"]
    assert "| GPUs | none (CPU) |" in _markdown(cpu)


# ---- the heat map's cell labels -------------------------------------------------------------------------

def _row(kernel: str, values: str, ratio) -> list:
    return [kernel, "forward", "fp16", values, "none", "none", "contiguous", 8, 8, 16, "PASS", ratio, None]


def _drawn_heatmap(rows: list, monkeypatch) -> tuple[dict, list]:
    """The heat map of ``rows``: its cell labels by (row, column), and the log10 values it colours."""
    import matplotlib.axes

    from flashcheck.report import plots

    labels, images = {}, []
    text, imshow = matplotlib.axes.Axes.text, matplotlib.axes.Axes.imshow

    def record_text(ax, x, y, s, *a, **k):
        labels[(y, x)] = s
        return text(ax, x, y, s, *a, **k)

    def record_imshow(ax, data, *a, **k):
        images.append((data, k.get("vmin"), k.get("vmax")))
        return imshow(ax, data, *a, **k)

    monkeypatch.setattr(matplotlib.axes.Axes, "text", record_text)
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", record_imshow)
    report = {"cases": {"columns": ["kernel", "pass", "dtype", "values", "mask", "causal", "layout", "n_q", "n_k",
                                    "head_dim", "status", "ratio", "cause"], "rows": rows}}
    plots._heatmap(plots._pyplot(), plots._columns(report), rows)
    return labels, images[0]


def test_heatmap_labels_say_the_recorded_worst(monkeypatch):
    ratios = {"a": 0.0, "b": 3e-5, "c": "nan", "d": 2.8e41, "e": 0.5, "f": 1e-4, "g": "inf"}
    rows = [_row("k", regime, ratio) for regime, ratio in ratios.items()]
    rows += [_row("k", "a", 0.0), _row("k", "e", 0.25), _row("k", "e", None)]  # the worst of several counts
    labels, (logs, vmin, vmax) = _drawn_heatmap(rows, monkeypatch)
    assert [labels[(i, 0)] for i in range(len(ratios))] == ["0", "<1e-4", "NaN", "2.8e+41", "0.5", "0.0001", "inf"]
    # the colours are as before: 0 and tiny at the floor, non-finite and huge at the ceiling
    assert [row[0] for row in logs] == [-4, -4, 6, 6, math.log10(0.5), -4, 6] and (vmin, vmax) == (-2, 2)


def test_heatmap_leaves_a_cell_with_no_ratio_blank(monkeypatch):
    labels, (logs, _, _) = _drawn_heatmap([_row("k", "a", 0.5), _row("j", "b", 0.5), _row("j", "a", None)],
                                          monkeypatch)
    assert (0, 0) not in labels and math.isnan(logs[0][0]) and labels[(1, 0)] == "0.5"
