"""Shapes as hypothesis strategies: lengths on tile edges or anywhere, decode steps, GQA groups, the spec's
head dims or the named ones (a [D, Dv] pair among them fixes both). :func:`shapes` checks its options and builds
its strategies once (a campaign draws thousands)."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from ..contract.head_dims import HeadDimPair, spec_choices
from ..contract.spec import DEFAULT_SPEC, KernelSpec
from ..contract.validation import Shapes
from ..errors import InvalidArgument
from ..features.forms import FormDraws, form_draws

__all__ = ["MAX_DECODE_QUERIES", "SPECIAL_LENGTHS", "shapes"]

# Lengths that sit on tile edges: 1, tile +- 1, primes, 64 mod 128, 1 mod 32.
SPECIAL_LENGTHS = (1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 97, 127, 128, 129, 131, 192, 193, 251, 257,
                   320, 449, 509, 1021, 1024, 1025, 2039, 4096, 8191, 16384, 32767, 65536, 65537, 131072, 262143,
                   1048576)
# A decode step: 1 to 16 queries (a paged kernel's queries a sequence, too).
MAX_DECODE_QUERIES = 16


def _check_sizes(argument: str, low: int, high: int) -> None:
    if not (isinstance(low, int) and isinstance(high, int)) or low < 1 or high < low:
        raise InvalidArgument(argument, (low, high), "expected 1 <= min <= max",
                              f"Pass integers with 1 <= min_{argument} <= max_{argument}.")


def _lengths(spec: KernelSpec, min_n: int, max_n: int):
    cap = min(max_n, spec.max_seqlen or max_n)
    special = [n for n in SPECIAL_LENGTHS if min_n <= n <= cap and n % spec.seq_multiple == 0]
    plain = st.integers(-(-min_n // spec.seq_multiple), cap // spec.seq_multiple).map(
        lambda n: n * spec.seq_multiple)
    return st.one_of(plain, st.sampled_from(special)) if special else plain


def shapes(*, spec: KernelSpec = DEFAULT_SPEC, min_n: int = 1, max_n: int = 256, max_batch: int = 2,
           max_heads: int = 4, head_dims=None, max_queries: int | None = None,
           max_decode_n: int | None = None) -> st.SearchStrategy[Shapes]:
    """Shapes the spec allows: lengths on tile edges or anywhere, GQA groups, head dims from the spec or from
    ``head_dims`` (those the spec allows of its single dims, and its [D, Dv] pairs, each of which it must allow)
    (``max_queries``: Nq from 1 to it, Nk from ``min_n`` to ``max_n``; None: both from ``min_n`` to ``max_n``;
    ``max_decode_n``: half the shapes are decode steps instead, 1 to 16 queries against ``min_n`` to it keys).
    The options are checked, and the strategies built, once: a campaign draws thousands of shapes."""
    _check_sizes("n", min_n, max_n)
    if max_decode_n is not None:
        _check_sizes("decode_n", min_n, max_decode_n)
    if max_queries is not None and max_queries < spec.seq_multiple:
        raise InvalidArgument("max_queries", max_queries, f"below the spec's seq_multiple={spec.seq_multiple}",
                              "Raise max_queries to at least the kernel's seq_multiple.")
    if min_n > (spec.max_seqlen or max_n) or -(-min_n // spec.seq_multiple) * spec.seq_multiple > max_n:
        raise InvalidArgument("max_n", max_n, f"no length in [{min_n}, {max_n}] fits the spec",
                              "Raise max_n or check seq_multiple / max_seqlen in the kernel spec.")
    fixed = form_draws(spec)
    if fixed is not None:
        return _fixed_shapes(spec, fixed, _lengths(spec, min_n, max_n), max_batch)
    allowed = spec.allowed_head_dims()
    choices = spec_choices(spec, head_dims) if head_dims else allowed
    if not choices:
        raise InvalidArgument("head_dims", head_dims, f"none allowed by the spec ({allowed[:8]}...)",
                              "Pick head dims the kernel spec declares.")
    dims = [d for d in choices if isinstance(d, int)]
    decode = max_queries is not None and not spec.equal_lengths
    steps = max_decode_n is not None and not spec.equal_lengths
    return _shapes(_ShapeDraws(
        spec=spec, step=st.booleans() if steps else None,
        step_lengths=(_lengths(spec, 1, max(MAX_DECODE_QUERIES, spec.seq_multiple)),
                      _lengths(spec, min_n, max_decode_n)) if steps else None,
        n_q=_lengths(spec, 1, max_queries) if decode else _lengths(spec, min_n, max_n),
        n_k=_lengths(spec, min_n, max_n), heads_kv=st.integers(1, max_heads),
        groups={h: st.integers(1, max(1, max_heads // h)) for h in range(1, max_heads + 1)},
        head_dim=st.sampled_from(sorted(choices, key=_draw_order)),
        head_dim_v={d: st.sampled_from(sorted(dims, key=lambda x: (x != d, x))) for d in dims},
        batch=st.integers(1, max_batch)))


def _fixed_shapes(spec: KernelSpec, fixed: FormDraws, n_k, max_batch: int) -> st.SearchStrategy[Shapes]:
    """The shapes of a form that fixes its heads, head dims and query counts (MLA's decode steps): a preset's
    head dims and decode lengths name other kernels' shapes, so only its key counts and batch apply."""
    return _shapes(_ShapeDraws(
        spec=spec, step=None, step_lengths=None, n_q=st.integers(1, fixed.max_queries), n_k=n_k,
        heads_kv=st.just(fixed.heads_kv), groups={fixed.heads_kv: st.integers(1, fixed.max_query_heads)},
        head_dim=st.sampled_from(fixed.head_dims), head_dim_v={}, batch=st.integers(1, max_batch)))


def _draw_order(choice: int | HeadDimPair) -> tuple:
    """Where a head dim sits in the draw, first where hypothesis shrinks to: multiples of 16 first, then by D; a
    pair after the single dim of its D (so that a list with no pair keeps the order, and the draws, it had)."""
    if isinstance(choice, HeadDimPair):
        return choice.d % 16 != 0, choice.d, choice.dv
    return choice % 16 != 0, choice


@dataclass(frozen=True)
class _ShapeDraws:
    """The strategies of one :func:`shapes` call, drawn in this order (the order hypothesis's choices follow)."""

    spec: KernelSpec
    step: object          # whether a shape is a decode step (None: never)
    step_lengths: object  # (Nq, Nk) of a decode step
    n_q: object
    n_k: object
    heads_kv: object
    groups: dict          # Hkv -> the GQA group sizes it allows
    head_dim: object      # a single D or a HeadDimPair
    head_dim_v: dict      # single D -> Dv, D first
    batch: object


@st.composite
def _shapes(draw, d: _ShapeDraws) -> Shapes:
    if d.step is not None and draw(d.step):
        n_q, n_k = draw(d.step_lengths[0]), draw(d.step_lengths[1])
    else:
        n_q = draw(d.n_q)
        n_k = n_q if d.spec.equal_lengths else draw(d.n_k)
    heads_kv = draw(d.heads_kv)
    group = draw(d.groups[heads_kv]) if d.spec.gqa else 1
    head_dim = draw(d.head_dim)
    if isinstance(head_dim, HeadDimPair):
        head_dim, dv = head_dim.d, head_dim.dv
    else:
        dv = head_dim if d.spec.dv_equals_d else draw(d.head_dim_v[head_dim])
    return Shapes(draw(d.batch), heads_kv * group, heads_kv, n_q, n_k, head_dim, dv)
