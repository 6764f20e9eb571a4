"""Render a report as Markdown and as one self-contained HTML page (inline CSS, plots as data: URIs).

Both come from one list of blocks (headings, paragraphs, tables, lists, code, images), so the two can
never say different things.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path

from ..campaign.result import shrink_state
from ..contract.formats import QUANTIZED_INPUTS
from ..files import write_bytes, write_text
from .plots import plots
from ..words import counted

__all__ = ["NO_GPU", "confidence_text", "ratio_text", "report_blocks", "to_html", "to_markdown", "write_pages", "write_report"]

# A block: ("h1" | "h2" | "h3" | "p", text), ("table", header, rows), ("ul", items), ("pre", text),
# ("img", name, title): a plot by name.
_STATUS_CLASS = {"SIGNED-OFF": "ok", "PASS": "ok", "BLOCKED": "bad", "BUG": "bad", "SUSPICIOUS": "warn"}


NO_GPU = "none (CPU)"  # what a report says for the GPUs of a run on the CPU


def ratio_text(value) -> str:
    """A recorded err/budget for people: "-" when there is none, "non-finite" for "nan" or "inf"."""
    if value is None:
        return "-"
    return "non-finite" if isinstance(value, str) else f"{value:.3g}"


def _counts(counts: dict) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0])))) or "-"


def _head(report: dict) -> list:
    fc, t = report["flashcheck"], report["totals"]
    commit = fc["commit"][:12] if fc["commit"] else "no git commit"
    commit += " (with local changes)" if fc.get("dirty") else ""
    seed = "no seed" if report["seed"] is None else f"seed {report['seed']}"
    return [("h1", f"flashcheck sign-off: {report['status']}"),
            ("p", f"{counted(t['judged'], 'case')} judged ({t['cases']:,} run) in {counted(t['campaigns'], 'campaign')}, "
                  f"{t['elapsed_s']:.0f} s; {counted(t['bugs'], 'distinct bug')}, {t['suspicious']} suspicious. Preset "
                  f"{report['preset']}, {seed}, device {report['device']}, created "
                  f"{report['created']}, flashcheck {fc['version'] or '(version unknown)'} at {commit}."),
            ("pre", report["command"])]


def _verdicts(report: dict) -> list:
    rows = [[c["kernel"], c["pass"], cell["dtype"], cell["status"], cell["judged"], ratio_text(cell["max_ratio"]),
             "; ".join(cell["reasons"]) or "-", ", ".join(cell.get("never_judged", ["(not recorded)"])) or "-"]
            for c in report["campaigns"] for cell in c["dtypes"]]
    return [("h2", "Verdict per kernel, pass and dtype"),
            ("table", ["kernel", "pass", "dtype", "status", "judged", "max err/budget", "reasons", "never judged"],
             rows)]


def _percent(rate: float) -> str:
    return f"{100 * rate:.3g}%"


def _more_than(bound: float) -> str:
    """A rate bound in words: "1 in 911 cases (0.11%)"; a bound of one half or more as a share."""
    return f"{_percent(bound)} of cases" if bound >= 0.5 else f"1 in {math.floor(1 / bound):,} cases ({_percent(bound)})"


def confidence_text(conf: dict) -> str:
    """What a cell's judged cases rule out (:func:`flashcheck.judge.verdict.rate_bound`), in words."""
    n, failed = conf["judged"], conf["failed"]
    if not n:
        return "no case judged: nothing is ruled out"
    if failed:
        return (f"n = {counted(n, 'judged case')}, {failed:,} failed: an observed failure rate of {_percent(failed / n)} "
                "on the cases this preset draws")
    return (f"n = {counted(n, 'judged case')}, none failed: on the cases this preset draws, a defect that hits more than "
            f"{_more_than(conf['upper_95'])} would have shown with 95% probability")


def _regime_rates(conf: dict) -> str:
    return ", ".join(f"{v} {c['judged']}" + (f" (rules out > {_percent(c['upper_95'])})" if not c["failed"]
                                             else f", {c['failed']} failed ({_percent(c['observed'])})")
                     for v, c in sorted(conf["by_values"].items(), key=lambda kv: kv[1]["judged"]))


def _cells(report: dict, field: str) -> list:
    """``(campaign, cell)`` for each cell that has ``field`` (reports before it lack it)."""
    return [(c, cell) for c in report["campaigns"] for cell in c["dtypes"] if field in cell]


def _confidence(report: dict) -> list:
    cells = _cells(report, "confidence")
    if not cells:
        return []
    rows = [[c["kernel"], c["pass"], cell["dtype"], confidence_text(cell["confidence"]),
             _regime_rates(cell["confidence"])] for c, cell in cells]
    return [("h2", "What the cases rule out"),
            ("p", "With n judged cases and none failed, the per-case failure rate is below 1 - 0.05^(1/n) (about "
                  "3/n) with 95% confidence, on the distribution this preset draws: not on inputs it does not draw "
                  "(never judged, and the conditions below). Per value regime, rarest first, the same bound:"),
            ("table", ["kernel", "pass", "dtype", "all judged cases", "per value regime"], rows)]


def _quantization(report: dict) -> list:
    cells = _cells(report, "quantization_error")
    if not cells:
        return []
    rows = [[c["kernel"], c["pass"], cell["dtype"], e["cases"], f"{e['min_cosine']:.6f}", f"{e['max_rel']:.3g}"]
            for c, cell in cells for e in (cell["quantization_error"],)]
    return [("h2", "The quantization error, apart from the verdicts"),
            ("p", "How far the inputs' quantization moved the exact answer, on the sampled cases of each quantized "
                  "cell (one drawn case in four): the float64 answers of the quantized values and of the "
                  "full-precision values compared. The verdicts judge each kernel on the values it was given; this "
                  "is what the quantization itself costs, the figure the field quotes as cosine similarity."),
            ("table", ["kernel", "pass", "dtype", "sampled cases", "least cosine", "largest |dO| / max |O|"], rows)]


_DREW = ("values", "mask", "causal", "layout", "shape")  # the fields shown by name; variants follow


def _drew(report: dict) -> list:
    cells = _cells(report, "drew")
    if not cells:
        return []
    rows = [[c["kernel"], c["pass"], cell["dtype"]] + [_counts(cell["drew"].get(f, {})) for f in _DREW]
            + ["; ".join(f"{f}: {_counts(n)}" for f, n in cell["drew"].items() if f not in _DREW
                         and set(n) != {"none"}) or "-", _counts(c["excluded"])] for c, cell in cells]
    return [("h2", "What each cell drew"),
            ("p", "Judged cases per value of each field; the spec's exclusions are the campaign's (all its dtypes)."),
            ("table", ["kernel", "pass", "dtype", *_DREW, "variants", "excluded by the spec"], rows)]


def _anchors(report: dict) -> list:
    rows = [[c["kernel"], c["pass"], cell["dtype"], rule, t["both_pass"],
             f"{t['flashcheck_only']} (max err/budget {ratio_text(t['max_ratio']['flashcheck_only'])})",
             f"{t['anchor_only']} (max err/budget {ratio_text(t['max_ratio']['anchor_only'])})", t["both"],
             t["not_applicable"]] for c, cell in _cells(report, "anchors") for rule, t in cell["anchors"].items()]
    if not rows:
        return []
    return [("h2", "The field's rules on the same cases"),
            ("p", "Each judged case's output also went through the field's usual rules (flash-attention's 2x rule, "
                  "PyTorch's SDPA fudge factors, the Triton tutorial's atol=1e-2). flashcheck only: flashcheck found "
                  "a BUG or SUSPICIOUS case the rule passed (the rule missed it). Rule only: flashcheck judged the "
                  "output legal rounding and the rule failed it (the rule's false alarm). n/a: the rule is "
                  f"undefined there (flash-attention's on fp32, {QUANTIZED_INPUTS})."),
            ("table", ["kernel", "pass", "dtype", "rule", "both pass", "flashcheck only", "rule only", "both fail",
                       "n/a"], rows)]


def _bug(bug: dict) -> list:
    s = bug.get("smallest") or {}
    shrink = f", {bug['shrink_cases']} more met while shrinking another bug" if bug.get("shrink_cases") else ""
    rows = [["failing cases", f"{bug['cases']} drawn{shrink}"], ["max err/budget", ratio_text(bug["max_ratio"])],
            ["dtypes", _counts(bug["dtypes"])], ["layouts", _counts(bug["layouts"])],
            ["causal", _counts(bug["causal"])], ["regimes", _counts(bug["regimes"])],
            ["where (cases)", _counts(bug.get("parts") or {})],
            ["finding kinds", ", ".join(bug["kinds"]) or "-"],
            ["smallest case", f"{s.get('case', '-')} ({shrink_state(s)})"]]
    if bug.get("model"):  # the defect models' line on the smallest case
        rows.append(["defect model", bug["model"]["line"]])
    blocks = [("h3", f"#{bug['id']} {bug['status']} {bug['kernel']} ({bug['pass']}) [{bug['cause']}]: "
                     f"{bug['title']}"), ("table", ["", ""], rows)]
    if bug["diagnosis"]:
        blocks.append(("ul", bug["diagnosis"]))
    if s:
        blocks.append(("pre", s["replay"]))
    return blocks


def _bugs(report: dict) -> list:
    if not report["bugs"]:
        return [("h2", "Distinct bugs"), ("p", "None found.")]
    bugs = len([b for b in report["bugs"] if b["status"] == "BUG"])
    suspicious = len(report["bugs"]) - bugs
    heading = f"Distinct bugs ({bugs})" + (f" and suspicious findings ({suspicious})" if suspicious else "")
    return [("h2", heading),
            ("p", "Failing cases grouped by root cause. Each keeps its smallest saved case; run its replay command "
                  "from this report's folder.")] + [b for bug in report["bugs"] for b in _bug(bug)]


def _conditions(report: dict) -> list:
    items = [f"{c['kernel']} ({c['pass']}): {n} cases excluded by the spec: {why}"
             for c in report["campaigns"] for why, n in c["excluded"].items()]
    items += [f"{c['kernel']} ({c['pass']}): {n} cases not judged: {why}"
              for c in report["campaigns"] for why, n in c["not_judged"].items()]
    items += [f"not checked: {x}" for x in report["not_checked"]]
    return [("h2", "Conditions: what was excluded or not judged"), ("ul", items or ["Nothing."])]


def _coverage(report: dict) -> list:
    cov = report["coverage"]
    masks = sorted({m for inner in cov["values_by_mask"].values() for m in inner})
    matrix = [[v] + [cov["values_by_mask"][v].get(m, 0) for m in masks] for v in sorted(cov["values_by_mask"])]
    axes = [[name, len(counts), _counts(counts)] for name, counts in cov["axes"].items()]
    return [("h2", "Coverage"),
            ("p", f"{cov['combinations']} distinct combinations of value regime, mask, causal alignment, layout and "
                  "dtype were judged. Cases per value of each axis:"),
            ("table", ["axis", "values hit", "cases per value"], axes),
            ("p", "Judged cases per value regime (rows) and mask regime (columns):"),
            ("table", ["values \\ mask"] + masks, matrix)]


def _campaigns(report: dict) -> list:
    rows = [[c["kernel"], c["pass"], c["verdict"], c["cases"], c["judged"], f"{c['elapsed_s']:.0f}",
             "-" if c["cases_per_s"] is None else c["cases_per_s"],
             c["stopped"] if isinstance(c["stopped"], str) else ", ".join(c["stopped"]),
             ", ".join(f"{k} {v:.0f} s" for k, v in c["time_split_s"].items() if v >= 0.5)]
            for c in report["campaigns"]]
    notes = [f"{c['kernel']} ({c['pass']}): {n}" for c in report["campaigns"] for n in c["notes"]]
    blocks = [("h2", "Campaigns"),
              ("table", ["kernel", "pass", "verdict", "cases", "judged", "s", "cases/s", "stopped", "time split"],
               rows)]
    return blocks + ([("ul", notes)] if notes else [])


def _machine(report: dict) -> list:
    m = report["machine"]
    gpus = "; ".join(f"{g['name']} ({g['memory_gib']} GiB, sm {g['capability']})" for g in m["gpus"]) or NO_GPU
    rows = [["GPUs", gpus]] + [[k, m.get(k) or "-"] for k in ("driver", "cuda", "cudnn", "torch", "triton",
                                                              "numpy", "hypothesis", "python", "platform", "cpu")]
    return [("h2", "Machine"), ("table", ["", ""], rows)]


def report_blocks(report: dict, plot_list: list) -> list:
    plots_ = [("h2", "Plots")] + [("img", name, title) for name, title, _ in plot_list]
    return (_head(report) + _verdicts(report) + _confidence(report) + _quantization(report) + _anchors(report)
            + _bugs(report)
            + _conditions(report) + _drew(report) + _coverage(report) + plots_ + _campaigns(report) + _machine(report))


# ---- Markdown -----------------------------------------------------------------------------------------

def _md_cell(x) -> str:
    return str(x).replace("|", "\\|").replace("\n", " ")


def to_markdown(blocks: list) -> str:
    out = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            out.append("#" * int(kind[1]) + " " + block[1])
        elif kind == "p":
            out.append(block[1])
        elif kind == "pre":
            out.append("```\n" + block[1] + "\n```")
        elif kind == "ul":
            out.append("\n".join(f"- {item}" for item in block[1]))
        elif kind == "img":
            out.append(f"![{block[2]}](plots/{block[1]}.png)")
        elif kind == "table":
            header, rows = block[1], block[2]
            lines = ["| " + " | ".join(map(_md_cell, header)) + " |", "|" + "---|" * len(header)]
            out.append("\n".join(lines + ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]))
    return "\n\n".join(out) + "\n"


# ---- HTML ---------------------------------------------------------------------------------------------

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1200px; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: .6em 0 1.2em; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; }
img { max-width: 100%; display: block; margin: .5em 0 1.5em; border: 1px solid #eee; }
.ok { color: #116611; font-weight: 600; } .bad { color: #b00020; font-weight: 600; }
.warn { color: #a65e00; font-weight: 600; }
"""


def _html_cell(x, tag: str = "td") -> str:
    text = html.escape(str(x))
    cls = _STATUS_CLASS.get(str(x))
    return f"<{tag} class=\"{cls}\">{text}</{tag}>" if cls else f"<{tag}>{text}</{tag}>"


def _html_block(block, images: dict) -> str:
    kind = block[0]
    if kind in ("h1", "h2", "h3", "p"):
        words = html.escape(block[1])
        if kind == "h1":  # the verdict stands out
            for status, cls in _STATUS_CLASS.items():
                words = words.replace(status, f'<span class="{cls}">{status}</span>')
        return f"<{kind}>{words}</{kind}>"
    if kind == "pre":
        return f"<pre>{html.escape(block[1])}</pre>"
    if kind == "ul":
        return "<ul>" + "".join(f"<li>{html.escape(str(i))}</li>" for i in block[1]) + "</ul>"
    if kind == "img":
        data = base64.b64encode(images[block[1]]).decode()
        return (f'<figure id="plot-{block[1]}"><img alt="{html.escape(block[2])}" src="data:image/png;base64,{data}">'
                f"<figcaption>{html.escape(block[2])}</figcaption></figure>")
    header, rows = block[1], block[2]
    head = "<tr>" + "".join(_html_cell(h, "th") for h in header) + "</tr>" if any(header) else ""
    return "<table>" + head + "".join("<tr>" + "".join(map(_html_cell, r)) + "</tr>" for r in rows) + "</table>"


def to_html(blocks: list, images: dict, title: str) -> str:
    body = "\n".join(_html_block(b, images) for b in blocks)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<link rel="icon" href="data:,"><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n')


def write_pages(blocks: list, plot_list: list, out: Path, *, stem: str, title: str) -> None:
    """``stem``.md beside ``plots/*.png``, and ``index.html`` (or ``stem``.html) with the plots inside."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)
    for name, _, png in plot_list:
        write_bytes(out / "plots" / f"{name}.png", png)
    write_text(out / f"{stem}.md", to_markdown(blocks))
    page = "index.html" if stem == "report" else f"{stem}.html"
    write_text(out / page, to_html(blocks, {name: png for name, _, png in plot_list}, title))


def report_json(report: dict) -> str:
    """``report`` as JSON for people and machines: indented, but one line per judged case (tens of
    thousands of them), which indentation would spread over a dozen lines each."""
    rows = report["cases"]["rows"]
    marker = "__flashcheck_case_rows__"
    text = json.dumps({**report, "cases": {**report["cases"], "rows": marker}}, indent=1, default=str)
    lines = ",\n".join(json.dumps(row) for row in rows)
    return text.replace(f'"{marker}"', f"[\n{lines}\n]" if rows else "[]") + "\n"


def write_report(report: dict, out) -> None:
    """``report.json``, ``report.md``, ``plots/`` and ``index.html`` in ``out``."""
    out = Path(out)
    write_text(out / "report.json", report_json(report))
    plot_list = plots(report)
    write_pages(report_blocks(report, plot_list), plot_list, out, stem="report",
                title=f"flashcheck sign-off: {report['status']}")
