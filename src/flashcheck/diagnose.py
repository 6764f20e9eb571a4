"""One-line diagnoses: where in the output a defect sits, and what that points to.

Bad elements are described by the rows, heads and columns they cover: tail rows of a partial tile,
rows at a tile period, the first or last rows, a few heads, every column or a few.
"""

from __future__ import annotations

import torch

from .validation import Shapes

__all__ = ["describe_rows", "diagnose_elements", "growth_with_length"]

TILES = (16, 32, 64, 128)


def _ranges(values: list[int], limit: int = 4) -> str:
    if not values:
        return "none"
    spans, start, prev = [], values[0], values[0]
    for x in values[1:]:
        if x != prev + 1:
            spans.append((start, prev))
            start = x
        prev = x
    spans.append((start, prev))
    text = ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in spans[:limit])
    return text + (f" (+{len(spans) - limit} more)" if len(spans) > limit else "")


def describe_rows(rows: list[int], n_rows: int) -> str:
    """What a set of bad query rows suggests (tail tile, tile period, edges)."""
    hints = []
    if not rows:
        return "no rows"
    bad = set(rows)
    tails = [t for t in TILES if 0 < (n_rows // t) * t < n_rows and min(bad) >= (n_rows // t) * t]
    if tails:
        start = (n_rows // tails[-1]) * tails[-1]
        sizes = ", ".join(str(t) for t in tails)
        hints.append(f"only the partial tail tile (rows {start}..{n_rows - 1}; tiles of {sizes})")
    for tile in TILES:
        phases = {r % tile for r in rows}
        if n_rows >= 2 * tile and len(rows) >= 2 and len(phases) <= max(1, tile // 8) \
                and len({r // tile for r in rows}) > 1:
            hints.append(f"periodic with tile {tile} (row phases {sorted(phases)[:4]})")
            break
    if bad == {0} or bad == {n_rows - 1}:
        hints.append("a single edge row")
    text = f"rows {_ranges(sorted(bad))} of {n_rows}"
    return text + ("; " + "; ".join(hints) if hints else "")


def diagnose_elements(bad: torch.Tensor, shapes: Shapes, rows: torch.Tensor | None = None,
                      empty_rows: torch.Tensor | None = None) -> str:
    """Summarise a boolean (B, Hq, R, Dv) map of bad output elements in one line."""
    bad = bad.detach().cpu()
    count = int(bad.sum())
    if count == 0:
        return "no element"
    B, Hq, R, Dv = bad.shape
    row_index = rows.cpu().tolist() if rows is not None else list(range(R))
    bad_rows = sorted({row_index[i] for i in torch.nonzero(bad.any(-1).any(0).any(0)).flatten().tolist()})
    heads = torch.nonzero(bad.any(-1).any(-1).any(0)).flatten().tolist()
    cols = int(bad.any(0).any(0).any(0).sum())
    parts = [f"{count} of {bad.numel()} elements", describe_rows(bad_rows, shapes.n_q)]
    if Hq > 1:
        parts.append(f"heads {_ranges(heads)} of {Hq}" if len(heads) < Hq else "every head")
        if shapes.heads_kv < Hq and len(heads) < Hq:
            groups = {h // shapes.group for h in heads}
            parts.append(f"kv heads {_ranges(sorted(groups))} (GQA group {shapes.group})")
    parts.append("every column" if cols == Dv else f"{cols} of {Dv} columns")
    if empty_rows is not None:
        touching = bool((bad.any(-1) & empty_rows.cpu()).any())
        if touching:
            parts.append("on rows with no visible key")
    if shapes.n_q != shapes.n_k:
        parts.append(f"Nq={shapes.n_q} != Nk={shapes.n_k}")
    return "; ".join(parts)


def _ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = float(rank)
    return ranks


def growth_with_length(points: list[tuple[int, float]], *, min_lengths: int = 4) -> str | None:
    """Across a campaign's cases of one bug, whether err/budget grows with the number of keys.

    ``points`` are (Nk, err/budget) pairs. A Spearman rank correlation of 0.8 or more over at least
    ``min_lengths`` distinct lengths says the defect accumulates along the keys (an accumulator, a
    running sum, a rescale), rather than sitting in one tile.
    """
    points = [(n, r) for n, r in points if r == r and r != float("inf")]
    if len({n for n, _ in points}) < min_lengths:
        return None
    xs, ys = _ranks([float(n) for n, _ in points]), _ranks([r for _, r in points])
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    var = (sum((x - mean_x) ** 2 for x in xs) * sum((y - mean_y) ** 2 for y in ys)) ** 0.5
    rho = cov / var if var else 0.0
    if rho < 0.8:
        return None
    return (f"grows with the number of keys (Spearman {rho:.2f} over {len(points)} cases, "
            f"Nk {min(n for n, _ in points)}..{max(n for n, _ in points)})")
