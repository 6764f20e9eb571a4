"""The covering order: the first cases of a campaign, a sign-off cell or a property test walk the input
space before hypothesis's free drawing takes over.

Most runs are short (25 examples in a kernel repository's property test, a minute of CI, under half a case
a second in the Triton interpreter), and free drawing is lumpy: in 45 cases it may never reach huge logits,
fully masked rows or a strided layout, so a defect every such case shows goes unseen. A covering plan
(:func:`covering_plan`) first gives every value of every pooled field (dtype, value regime, mask, causal
alignment, scale, layout) one case, as few cases as the largest pool, then adds cases that cover every
pair of values of two fields, greedily, most new pairs first. The plan is reproducible from its seed.

Each planned cell becomes a real hypothesis case (:func:`planned_choices`): the pooled fields are drawn
first by :func:`flashcheck.inputs.recipe_draws.recipes`, so a prefix of choices pins them, and the rest (the
shapes, the seed of the values) is drawn at random. Replayed from an example database, such a case is
judged, and shrunk when it fails, like any case hypothesis drew itself.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from ..hypothesis_internals import Drawn, draw_from_prefix
from .recipe import POOL_FIELDS
from .shape_draws import SPECIAL_LENGTHS
from .sizes import INT32_ELEMENTS

__all__ = ["COVERAGE_FIELDS", "SHAPE_CLASSES", "PlanShare", "covering_plan", "covering_size", "empty_coverage",
           "pairs_of", "planned_choices", "shape_classes"]

# What a summary counts its judged cases by: the pooled fields, and the classes of their shapes.
COVERAGE_FIELDS = POOL_FIELDS + ("shape",)
SHAPE_CLASSES = ("one_query", "one_key", "tile_edge", "unequal_lengths", "long", "gqa", "batched", "odd_head_dim",
                 "wide_head_dim", "past_int32")
_LONG = 1024  # keys from which a row's accumulation is long
# Past it a head dim no longer fits the register tiles of most flash kernels (the Triton kernels' limit): MLA's.
_WIDE = 256

_CANDIDATES = 24  # rows tried for each added row of the pair phase: the best one is kept
_DESIGNED = ("mask", "scale", "layout")  # held at their simplest while each value regime comes as designed
_TURNS = ("dtype", "causal")  # take turns through both rounds of singles


@dataclass(frozen=True)
class PlanShare:
    """The part of a covering plan one campaign runs: the plan of ``seed`` for a campaign of ``budget``
    cases, every ``of``-th cell from ``index`` (the workers of ``--jobs`` share one plan, not one each).
    A worker that takes over a lost one's share (its ``run``-th) leaves out the first ``skip`` cells, which its
    predecessors drew, and draws the others' values anew, so that it judges none of their cases again."""

    seed: int | None = None
    index: int = 0
    of: int = 1
    budget: int | None = None
    skip: int = 0
    run: int = 0

    def cells(self, pools: dict[str, list], budget: int) -> list[dict]:
        size = covering_size(pools, self.budget if self.budget is not None else budget)
        return covering_plan(pools, seed=self.seed, limit=size)[self.index::self.of][self.skip:]

    def cell_seed(self, i: int) -> int:
        """The seed of the values of the share's ``i``-th cell, of those :meth:`cells` gives."""
        place = (self.seed, self.index, i + self.skip)
        return hash(place + (self.run,) if self.run else place)


def covering_size(pools: dict[str, list], budget: int) -> int:
    """How many of ``budget`` cases a plan takes: every single if the budget holds them, else the whole
    budget; pairs up to half the budget, so that hypothesis's own search keeps the other half."""
    singles = len(pools.get("values", ())) + max((len(v) for f, v in pools.items() if f != "values"), default=0)
    return min(budget, max(singles, budget // 2))


def covering_plan(pools: dict[str, list], *, seed: int | None, limit: int) -> list[dict]:
    """At most ``limit`` cells (field -> value over :data:`POOL_FIELDS`): each value of each field once,
    then the pairs of values of two fields. ``pools`` is :func:`~flashcheck.inputs.recipe_draws.recipe_pools`.
    A field of one value has nothing to cover and takes no part: a kernel's plan is the same whatever features
    and forms it does not take."""
    rng = random.Random(f"covering/{seed}")
    fields = [f for f in POOL_FIELDS if len(pools.get(f, ())) > 1]
    singles = _singles(pools, fields, rng)
    plan = singles[:limit]
    uncovered = pairs_of(pools, fields) - set().union(*(_pairs(cell, fields) for cell in plan))
    while uncovered and len(plan) < limit:
        ordered = sorted(uncovered)  # once a row, not once a candidate: thousands of pairs
        cell = max((_candidate(pools, fields, uncovered, ordered, rng) for _ in range(_CANDIDATES)),
                   key=lambda c: len(_pairs(c, fields) & uncovered))
        plan.append(cell)
        uncovered -= _pairs(cell, fields)
    one_value = {f: pools[f][0] for f in POOL_FIELDS if f in pools and f not in fields}
    return [{f: cell[f] if f in cell else one_value[f] for f in POOL_FIELDS if f in pools} for cell in plan]


def _singles(pools: dict, fields: list, rng: random.Random) -> list[dict]:
    """Each value regime as it was designed (the simplest mask, scale and layout: a tiny scale or a mask
    hides what a regime was built to show), taking turns with as many cells as the largest other pool,
    in which each value of each other field comes once (the smaller pools round again). The dtypes and
    causal alignments take turns throughout; the pairs met in the second kind vary with the seed."""
    turns = {f: rng.sample(pools[f], len(pools[f])) for f in fields}
    designed = [{f: (v if f == "values" else pools[f][0] if f in _DESIGNED else turns[f][i % len(turns[f])])
                 for f in fields} for i, v in enumerate(pools.get("values", [None]))]
    others = [f for f in fields if f != "values"]
    rows = max((len(pools[f]) for f in others), default=0)
    rest = [{f: turns[f][(i + (len(designed) if f in _TURNS else 0)) % len(turns[f])] for f in fields}
            for i in range(rows)]
    # Interleaved: the first cases hold a few regimes as designed and a few other masks, scales, layouts.
    merged = [c for pair in itertools.zip_longest(designed, rest) for c in pair if c is not None]
    return [{f: c[f] for f in fields if c[f] is not None} for c in merged]


def pairs_of(pools: dict, fields: list) -> set:
    """Every pair of values of two fields: ``(field_a, value_a, field_b, value_b)``."""
    return {(a, x, b, y) for a, b in itertools.combinations(fields, 2) for x in pools[a] for y in pools[b]}


def _pairs(cell: dict, fields: list) -> set:
    return {(a, cell[a], b, cell[b]) for a, b in itertools.combinations(fields, 2)}


def _candidate(pools: dict, fields: list, uncovered: set, ordered: list, rng: random.Random) -> dict:
    """A cell that holds one uncovered pair (of ``ordered``, the pairs sorted), its other fields chosen one
    by one for the most new pairs."""
    a, x, b, y = rng.choice(ordered)
    cell = {a: x, b: y}
    for f in rng.sample(fields, len(fields)):
        if f in cell:
            continue
        cell[f] = max(rng.sample(pools[f], len(pools[f])),
                      key=lambda v: sum((g, cell[g], f, v) in uncovered or (f, v, g, cell[g]) in uncovered
                                        for g in cell))
    return {f: cell[f] for f in fields}


def shape_classes(s) -> tuple[str, ...]:
    """The classes of :data:`SHAPE_CLASSES` that shapes ``s`` (:class:`~flashcheck.contract.validation.Shapes`)
    belong to: a single query or key, a length on a tile edge (1 and tile +- 1, primes, 64 mod 128),
    Nq != Nk, a long row, grouped heads, a batch, a head dim not a multiple of 16, D or Dv past 256, a tensor past
    2^31 elements."""
    edges = set(SPECIAL_LENGTHS) - {1}
    found = {"one_query": s.n_q == 1, "one_key": s.n_k == 1, "tile_edge": s.n_q in edges or s.n_k in edges,
             "unequal_lengths": s.n_q != s.n_k, "long": s.n_k >= _LONG, "gqa": s.heads_q != s.heads_kv,
             "batched": s.batch > 1, "odd_head_dim": s.head_dim % 16 != 0,
             "wide_head_dim": max(s.head_dim, s.head_dim_v) > _WIDE, "past_int32": _largest(s) > INT32_ELEMENTS}
    return tuple(c for c in SHAPE_CLASSES if found[c])


def _largest(s) -> int:
    """Elements of the largest of q, k, v and out."""
    return s.batch * max(s.heads_q * s.n_q, s.heads_kv * s.n_k) * max(s.head_dim, s.head_dim_v)


def empty_coverage(pools: dict[str, list]) -> dict[str, dict]:
    """Each coverage field with a count of 0 for every value it can take, so that what was never judged
    shows (and merges) as 0."""
    return {f: dict.fromkeys(pools.get(f, SHAPE_CLASSES if f == "shape" else ()), 0) for f in COVERAGE_FIELDS}


def planned_choices(strategy, pools: dict[str, list], cell: dict, *, seed: int) -> Drawn | None:
    """The choices (serialised for an example database) by which hypothesis draws, from ``strategy``
    (:func:`recipes` over ``pools``, or a fixed dictionary whose first entry it is), a case with the pooled
    fields of ``cell``, the rest drawn from ``seed``; with what was drawn. None when this hypothesis draws
    otherwise (its internals moved): the plan then leaves that cell to free drawing."""
    # A pool of one value is drawn without a choice (hypothesis makes it a constant).
    prefix = [pools[f].index(cell[f]) for f in POOL_FIELDS if f in cell and len(pools[f]) > 1]
    found = draw_from_prefix(strategy, prefix, seed=seed)
    if found is None:
        return None
    recipe = next(iter(found.value.values())) if isinstance(found.value, dict) else found.value
    if any(getattr(recipe, f, None) != v for f, v in cell.items()):
        return None
    return found
