"""One-line diagnoses: where in the output a defect sits, and what that points to.

Bad elements are described by the rows, heads and columns they cover: tail rows of a partial tile,
rows at a tile period, the first or last rows, a few heads, every column or a few.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from ..contract.formats import output_format
from ..contract.masks import and_masks
from ..contract.masks import causal as causal_fn
from ..contract.validation import Shapes
from ..features.registry import by_term
from ..features.scores import compose
from ..features.variant import Variant
from ..numerics.blockwise import dequantized
from .variant_misreads import misread_logits, row_biases

__all__ = ["describe_ranges", "describe_rows", "diagnose_elements", "first_index", "growth_with_length",
           "which_keys"]

TILES = (16, 32, 64, 128)


def describe_ranges(values: list[int], limit: int = 4) -> str:
    """Sorted indices as runs: ``0..3, 7, 9..12`` (the first ``limit`` runs, then how many more)."""
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


def first_index(bad: torch.Tensor) -> tuple[int, ...]:
    """The index of the first True element of a bool map: the example element a finding names."""
    return tuple(int(i) for i in torch.nonzero(bad)[0])


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
    text = f"rows {describe_ranges(sorted(bad))} of {n_rows}"
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
        parts.append(f"heads {describe_ranges(heads)} of {Hq}" if len(heads) < Hq else "every head")
        if shapes.heads_kv < Hq and len(heads) < Hq:
            groups = {h // shapes.group for h in heads}
            parts.append(f"kv heads {describe_ranges(sorted(groups))} (GQA group {shapes.group})")
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


# ---- which keys: the key set a wrong row's output is attention over ------------------------------------


def which_keys(got, inputs: dict, index: tuple, budget, *, row: int | None = None) -> str | None:
    """Which keys the output row at ``index`` = (b, h, r, column) was computed over, if not its own.

    Attention over a wrong set of keys is the commonest flash bug: a tail tile dropped or read
    unmasked, the causal diagonal off by one, a mask ignored. For the worst row this tries, in float64,
    the row's visible keys cut to a prefix or a suffix, with one key left out, with none, with one
    masked-out key let in or with all of them, and names the set whose attention output matches the
    kernel's row within the row's budget (``budget``: the budget's total for that row, per column),
    the fewest keys changed first. A match is a fact about the numbers, not proof of the cause: with
    peaked attention a wrong temperature can look like a dropped key. ``row`` is the query index when
    ``index`` counts the oracle's sampled rows. ``None`` when no such set matches.
    """
    key_row = _KeyRow.at(got, inputs, index, budget, row)
    if key_row is None or key_row.is_own_attention():
        return None  # no visible key, or the row is its own attention within budget: not a key-set defect
    candidates = [found for key_set in _KEY_SETS if (found := key_set(key_row)) is not None]
    if not candidates:
        return None
    _, fit, text = min(candidates)
    return f"row {key_row.i} matches attention with {text} (err/budget {fit:.2g} against it)"


@dataclass
class _KeyRow:
    """One output row of the kernel beside what attention over any set of its keys gives, in float64.

    With a sink, every key set's sum has the sink's term too (the sink is no key: it is never cut)."""

    i: int  # the query index
    n_q: int
    causal: str
    seen: torch.Tensor  # (Nk,) the keys this query may see (every key-restricting feature's included)
    scores: torch.Tensor  # (Nk,) the logits: q . k * scale, soft-capped when the variant caps them
    values: torch.Tensor  # (Nk, Dv)
    got: torch.Tensor  # (Dv,) the kernel's row
    budget: torch.Tensor  # (Dv,) its budget
    variant: Variant = field(default_factory=Variant)
    dots: torch.Tensor | None = None  # (Nk,) q . k, unscaled
    scale: float = 1.0
    sink: float | None = None  # this head's sink logit
    u_out: float = 0.0  # the unit roundoff of the kernel's output
    biases: dict = field(default_factory=dict)  # name -> (Nk,) each bias feature's term (0 where it hides a key)
    b: int = 0  # the batch entry and query head
    h: int = 0
    group: int = 1  # query heads per K/V head

    @classmethod
    def at(cls, got, inputs: dict, index: tuple, budget, row: int | None) -> "_KeyRow | None":
        """The row at ``index`` (see :func:`which_keys`); None when its query sees no key."""
        b, h, r = index[:3]
        i = r if row is None else row
        variant = inputs.get("variant") or Variant()
        u_out = output_format(inputs["q"]).unit_roundoff
        q, k, v = dequantized(inputs["q"], inputs["k"], inputs["v"], variant)
        B, Hq, Nq, _ = q.shape
        Nk, group = k.shape[2], Hq // k.shape[1]
        fn = causal_fn(inputs["causal"], Nq, Nk)
        extra = variant.visible(Nq, Nk, Hq)
        seen = (fn if extra is None else and_masks(fn, extra))(b, h, torch.tensor(i), torch.arange(Nk))
        mask = inputs.get("attn_mask")
        if mask is not None:
            seen = seen & torch.broadcast_to(mask.cpu().bool(), (B, Hq, Nq, Nk))[b, h, i]
        shown = variant.shown(Nq, Nk, Hq)
        if shown is not None:  # trusted full blocks
            seen = seen | shown(b, h, torch.tensor(i), torch.arange(Nk))
        if not bool(seen.any()):
            return None
        biases = row_biases(variant, b, h, i, Nq, Nk)
        for name, bias in biases.items():  # a bias of -inf hides its key
            seen = seen & (bias > -math.inf)
            biases[name] = bias.masked_fill(bias == -math.inf, 0.0)
        if not bool(seen.any()):
            return None
        dots = k[b, h // group].cpu().double() @ q[b, h, i].cpu().double()
        sink = None if variant.sink is None else float(variant.sink[h])
        scale = float(inputs["scale"])
        return cls(i, Nq, inputs["causal"], seen, compose(dots * scale, biases.values(), variant.cap,
                                                          variant.bias_order),
                   v[b, h // group].cpu().double(), got.detach().cpu().double(), budget.detach().cpu().double(),
                   variant, dots, scale, None if sink == -math.inf else sink, u_out, biases, b, h, group)

    @property
    def n_k(self) -> int:
        return self.seen.shape[0]

    @functools.cached_property
    def n_seen(self) -> int:
        return int(self.seen.sum())

    @property
    def hidden(self) -> torch.Tensor:
        return ~self.seen

    @property
    def diagonal(self) -> int | None:
        """The last key the causal mask lets this query see (None without a causal mask)."""
        if self.causal == "none":
            return None
        return self.i + (self.n_k - self.n_q if self.causal == "bottom_right" else 0)

    def edge(self, j: int, *, inside: bool) -> str:
        """What key ``j`` is to this query: the causal diagonal, an edge of a key-restricting feature (each
        feature's ``edge``), one past it (or nothing)."""
        diagonal = self.diagonal
        if diagonal is not None and j == diagonal + (0 if inside else 1):
            return " (the causal diagonal)" if inside else " (just past the causal diagonal)"
        for f in by_term("keys"):
            value = getattr(self.variant, f.name)
            text = "" if value is None else f.edge(value, self.i, j, self.n_q, self.n_k, inside)
            if text:
                return text
        return ""

    def fits(self, outs: torch.Tensor) -> torch.Tensor:
        """err/budget of the row against each candidate output (rows of ``outs``); inf where undefined. The
        budget is the exact row's, plus the rounding of the candidate's own output where it is larger."""
        err = (self.got - outs).abs()
        ratio = torch.where(err == 0, 0.0, err / (self.budget + self.u_out * outs.abs())).amax(-1)
        return torch.nan_to_num(ratio, nan=math.inf)

    def weights(self, keys: torch.Tensor, scores: torch.Tensor | None = None):
        """Softmax numerators over ``keys`` (0 elsewhere), each key's weighted value row, and the sink's
        numerator (0 without one), all relative to one maximum."""
        scores = self.scores if scores is None else scores
        top = scores[keys].max() if self.sink is None else max(float(scores[keys].max()), self.sink)
        w = torch.where(keys, torch.exp(scores - top), 0.0)
        sink = 0.0 if self.sink is None else math.exp(self.sink - top)
        return w, w[:, None] * self.values, sink

    def output(self, keys: torch.Tensor, scores: torch.Tensor | None = None, *, with_sink: bool = True):
        w, wv, sink = self.weights(keys, scores)
        return wv.sum(0) / (w.sum() + (sink if with_sink else 0.0))

    @functools.cached_property
    def visible(self):
        return self.weights(self.seen)

    @functools.cached_property
    def every(self):
        return self.weights(torch.ones_like(self.seen))

    def is_own_attention(self) -> bool:
        return float(self.fits(self.output(self.seen)[None])[0]) <= 1


# A candidate is (keys changed, err/budget, description): the fewest keys changed that explain the row,
# then the best fit. Each key set below gives its best candidate, or None when none fits.


def _best(ratios: torch.Tensor, usable: torch.Tensor, changed: torch.Tensor, describe) -> tuple | None:
    ratios = torch.where(usable, ratios, math.inf)
    fitting = torch.nonzero(ratios <= 1).flatten().tolist()
    if not fitting:
        return None
    at = min(fitting, key=lambda x: (int(changed[x]), float(ratios[x])))
    return int(changed[at]), float(ratios[at]), describe(at)


def _cuts(row: _KeyRow):
    """Prefixes and suffixes of the visible keys, from running sums: entry t-1 is attention over keys < t
    (or >= t), for t = 1..Nk-1. A cut that leaves out one visible key is that key left out, which the
    single-key sets name: ``cut`` marks the cuts that keep a visible key on each side."""
    w, wv, _ = row.visible
    left = row.seen.cumsum(0)[:-1]
    return w.cumsum(0)[:-1], wv.cumsum(0)[:-1], left, (left > 0) & (left < row.n_seen)


def _only_a_prefix(row: _KeyRow) -> tuple | None:
    cw, cwv, left, cut = _cuts(row)
    sink = row.visible[2]
    return _best(row.fits(cwv / (cw + sink)[:, None]), cut & (row.n_seen - left > 1), row.n_seen - left,
                 lambda x: f"keys {x + 1}..{row.n_k - 1} ({row.n_seen - int(left[x])} visible) left out")


def _only_a_suffix(row: _KeyRow) -> tuple | None:
    cw, cwv, left, cut = _cuts(row)
    w, wv, sink = row.visible
    return _best(row.fits((wv.sum(0) - cwv) / (w.sum() - cw + sink)[:, None]), cut & (left > 1), left,
                 lambda x: f"keys 0..{x} ({int(left[x])} visible) left out")


def _one_visible_key_left_out(row: _KeyRow) -> tuple | None:
    if row.n_seen <= 1:
        return None
    w, wv, sink = row.visible
    return _best(row.fits((wv.sum(0) - wv) / (w.sum() - w + sink)[:, None]), row.seen,
                 torch.ones(row.n_k, dtype=torch.long),
                 lambda j: f"visible key {j}{row.edge(j, inside=True)} left out")


def _no_key(row: _KeyRow) -> tuple | None:
    return _best(row.fits(torch.zeros_like(row.values[:1])), torch.tensor([True]), torch.tensor([row.n_seen]),
                 lambda _: f"all {row.n_seen} visible keys left out (a row of 0)")


def _every_key(row: _KeyRow) -> tuple | None:
    if not bool(row.hidden.any()):
        return None
    w, wv, sink = row.every
    span = describe_ranges(torch.nonzero(row.hidden).flatten().tolist())
    return _best(row.fits((wv.sum(0) / (w.sum() + sink))[None]), torch.tensor([True]),
                 torch.tensor([int(row.hidden.sum())]), lambda _: f"the masked-out keys ({span}) let in")


def _one_masked_out_key_let_in(row: _KeyRow) -> tuple | None:
    if not bool(row.hidden.any()):
        return None
    w, wv, sink = row.every
    return _best(row.fits((wv[row.seen].sum(0) + wv) / (w[row.seen].sum() + w + sink)[:, None]), row.hidden,
                 torch.ones(row.n_k, dtype=torch.long),
                 lambda j: f"masked-out key {j}{row.edge(j, inside=False)} let in")


def _variant_misread(row: _KeyRow) -> tuple | None:
    """The visible keys, with the variant misread: the sink left out of the sum, and each feature's misreads
    (:func:`~flashcheck.judge.variant_misreads.misread_logits`)."""
    outs, names = [], []
    if row.sink is not None:
        outs.append(row.output(row.seen, with_sink=False))
        names.append("the sink left out of the sum (sink ignored)")
    for what, logits in misread_logits(row):
        outs.append(row.output(row.seen, logits))
        names.append(what)
    if not outs:
        return None
    return _best(row.fits(torch.stack(outs)), torch.ones(len(outs), dtype=torch.bool),
                 torch.ones(len(outs), dtype=torch.long), lambda x: names[x])


_KEY_SETS = (_only_a_prefix, _only_a_suffix, _one_visible_key_left_out, _no_key, _every_key,
             _one_masked_out_key_let_in, _variant_misread)
