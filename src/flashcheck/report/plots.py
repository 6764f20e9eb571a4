"""The report's plots (matplotlib, as PNG bytes): err/budget by dtype and regime, the worst ratio per regime
and kernel as a heat map, and err/budget against the number of keys.

Ratios are plotted on a log scale: a ratio of 0 (an exact output) sits at the floor, and a non-finite
output (NaN, recorded as ``"nan"``) at the ceiling, marked, because it is the worst there is. The heat map's
cells are coloured on that clamped scale but labelled with the recorded worst ("0", "<1e-4", "2.8e+41", "NaN").
"""

from __future__ import annotations

import io
import math

from ..errors import InvalidArgument
from ..judge.verdict import RATIO_CEILING

__all__ = ["FLOOR", "CEILING", "check_plotting", "plots"]

FLOOR, CEILING = 1e-4, RATIO_CEILING  # where 0 and non-finite ratios are drawn


def _pyplot():
    try:
        import matplotlib  # an optional extra, imported only where plots are drawn
    except ImportError:
        raise InvalidArgument("plots", "matplotlib", "is not installed; a report's plots need it",
                              "pip install 'flashcheck[report]' (or pip install matplotlib).") from None
    matplotlib.use("Agg")  # no screen: render to files only
    import matplotlib.pyplot as plt  # after use(): pyplot picks its backend when imported

    return plt


def check_plotting() -> None:
    """:class:`InvalidArgument` now, before an hour of campaigns, if the report's plots cannot be drawn."""
    _pyplot()


def _ratio(value) -> float:
    """A recorded ratio on the plot's scale."""
    if value is None:
        return math.nan
    x = float(value)
    return CEILING if not math.isfinite(x) else min(max(x, FLOOR), CEILING)


def _label(value: float) -> str:
    """A heat map cell's text: the recorded worst itself, not where the colour scale clamps it."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "inf"
    if value == 0:
        return "0"
    return f"<1e{round(math.log10(FLOOR))}" if value < FLOOR else f"{value:.2g}"


def _worst(a: float, b: float) -> float:
    """The worse of two recorded ratios; NaN (a non-finite output) is the worst there is."""
    return a if math.isnan(a) or (not math.isnan(b) and a >= b) else b


def _png(fig) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _columns(report: dict) -> dict:
    return {name: i for i, name in enumerate(report["cases"]["columns"])}


def _by(rows: list, key) -> dict:
    groups: dict = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    return groups


# Each plot takes pyplot, the column index of the case rows, and the rows it draws (never empty).

def _distribution(plt, c: dict, rows: list) -> bytes:
    pass_ = rows[0][c["pass"]]
    by_dtype = _by(rows, lambda r: r[c["dtype"]])
    regimes = sorted({r[c["values"]] for r in rows})
    fig, axes = plt.subplots(1, len(by_dtype), figsize=(4.2 * len(by_dtype), 0.32 * len(regimes) + 1.6),
                             sharey=True, squeeze=False)
    for ax, (dtype, group) in zip(axes[0], sorted(by_dtype.items())):
        per = _by(group, lambda r: r[c["values"]])
        data = [[_ratio(r[c["ratio"]]) for r in per.get(name, [])] or [math.nan] for name in regimes]
        try:
            ax.boxplot(data, orientation="horizontal", whis=(0, 100), widths=0.6)
        except TypeError:  # matplotlib before 3.10
            ax.boxplot(data, vert=False, whis=(0, 100), widths=0.6)
        ax.set_xscale("log")
        ax.axvline(1.0, color="crimson", lw=1, ls="--")
        ax.set_title(f"{dtype} ({len(group)} cases)")
        ax.set_xlabel("error / budget (line: the budget)")
    axes[0][0].set_yticks(range(1, len(regimes) + 1), regimes)
    fig.suptitle(f"{pass_}: err/budget per dtype and value regime (whiskers: min and max)")
    return _png(fig)


def _heatmap(plt, c: dict, rows: list) -> bytes:
    runs = sorted({(r[c["kernel"]], r[c["pass"]]) for r in rows})
    regimes = sorted({r[c["values"]] for r in rows})
    worst = [[None] * len(runs) for _ in regimes]  # the recorded ratio, None where no case has one
    for r in rows:
        if r[c["ratio"]] is None:
            continue
        i, j = regimes.index(r[c["values"]]), runs.index((r[c["kernel"]], r[c["pass"]]))
        x = float(r[c["ratio"]])
        worst[i][j] = x if worst[i][j] is None else _worst(worst[i][j], x)
    logs = [[math.nan if x is None else math.log10(_ratio(x)) for x in row] for row in worst]
    fig, ax = plt.subplots(figsize=(1.2 * len(runs) + 3, 0.34 * len(regimes) + 1.8))
    image = ax.imshow(logs, cmap="RdYlGn_r", vmin=-2, vmax=2, aspect="auto")
    for i, row in enumerate(worst):
        for j, x in enumerate(row):
            if x is not None:
                ax.text(j, i, _label(x), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(runs)), [f"{k} {p}" for k, p in runs], fontsize=7, rotation=30, ha="right")
    ax.set_yticks(range(len(regimes)), regimes, fontsize=8)
    fig.colorbar(image, ax=ax, label="log10 worst error/budget (over 0: a bug)")
    ax.set_title("worst err/budget per value regime and kernel")
    return _png(fig)


def _versus_n(plt, c: dict, rows: list) -> bytes:
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    markers = {"forward": "o", "backward": "^"}
    for (kernel, pass_), group in sorted(_by(rows, lambda r: (r[c["kernel"]], r[c["pass"]])).items()):
        ax.scatter([r[c["n_k"]] for r in group], [_ratio(r[c["ratio"]]) for r in group], s=6, alpha=0.5,
                   marker=markers.get(pass_, "o"), label=f"{kernel} {pass_}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="crimson", lw=1, ls="--")
    ax.set_xlabel("keys (Nk)")
    ax.set_ylabel("error / budget")
    ax.set_title("err/budget against the number of keys (top: non-finite, bottom: exact)")
    ax.legend(fontsize=7, markerscale=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def plots(report: dict) -> list[tuple[str, str, bytes]]:
    """``(name, title, png)`` for each plot the report's cases allow (a pass with no case has none)."""
    plt, c = _pyplot(), _columns(report)
    rows = report["cases"]["rows"]
    by_pass = _by(rows, lambda r: r[c["pass"]])
    wanted = [(f"ratio-{p}", f"err/budget per dtype and value regime ({p})", _distribution, by_pass.get(p))
              for p in ("forward", "backward")]
    wanted += [("worst-heatmap", "worst err/budget per value regime and kernel", _heatmap, rows),
               ("ratio-vs-keys", "err/budget against the number of keys", _versus_n, rows)]
    return [(name, title, draw(plt, c, chosen)) for name, title, draw, chosen in wanted if chosen]
