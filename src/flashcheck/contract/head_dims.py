"""Head dims: flashcheck's limit on them, and the head dims a preset, a property test or a strategy names.

A named head dim is D alone (Dv = D, or Dv drawn from the single dims where the spec lets Dv differ) or a
pair [D, Dv] that fixes both. Multi-head latent attention needs pairs: its Dv sits far from D (576 and 512 in
absorbed decode, 192 and 128 in prefill) and from any other dim a kernel takes. The names are checked here, once:
their form where they are read (:func:`head_dim_choices`), the spec's word on them where shapes are drawn
(:func:`spec_choices`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .counts import check_count

__all__ = ["MAX_HEAD_DIM", "HeadDimPair", "head_dim_choices", "spec_choices"]

# The largest D and Dv a spec may declare: the float64 oracle's bound holds against mpmath at MLA's 576 / 512 and
# at 1,024, and the budget holds for PyTorch's math backend and the flash twin at 576 / 512
# (tests/unit/test_mla_dims.py). D enters them only through gamma_D and the size of their work arrays.
MAX_HEAD_DIM = 1024

_FIX = (f"Give head dims as whole numbers from 1 to {MAX_HEAD_DIM}, each alone (D) or as a pair [D, Dv] that "
        "fixes V's head dim too, e.g. [[576, 512], [192, 128], 64].")


@dataclass(frozen=True)
class HeadDimPair:
    """Q's and K's head dim ``d`` drawn together with V's ``dv``."""

    d: int
    dv: int


def head_dim_choices(argument: str, value) -> tuple | None:
    """``value`` (None, a head dim, or a list of head dims and [D, Dv] pairs) as a tuple of ints and
    :class:`HeadDimPair`, in its order; None stays None. Each dim is a whole number from 1 to MAX_HEAD_DIM."""
    if value is None:
        return None
    items = (value,) if isinstance(value, (int, HeadDimPair)) else tuple(value)
    return tuple(_choice(argument, item) for item in items)


def _choice(argument: str, item) -> int | HeadDimPair:
    if isinstance(item, HeadDimPair):
        item = [item.d, item.dv]
    if isinstance(item, (list, tuple)):
        if len(item) != 2:
            raise InvalidArgument(argument, item, "a pair holds two head dims, [D, Dv]", _FIX)
        d, dv = (check_count(argument, n, maximum=MAX_HEAD_DIM, what="a head dim", fix=_FIX) for n in item)
        return HeadDimPair(d, dv)
    return check_count(argument, item, maximum=MAX_HEAD_DIM, what="a head dim or a pair [D, Dv]", fix=_FIX)


def spec_choices(spec, head_dims) -> tuple:
    """The named head dims a kernel of ``spec`` is drawn with, in their order: each single dim the spec allows
    (the others are left out, since a preset serves many kernels) and every pair, which the spec must allow: a
    pair names one kernel's shape, so one the spec forbids is an :class:`InvalidArgument` naming ``head_dims``."""
    allowed = set(spec.allowed_head_dims())
    kept = []
    for choice in head_dim_choices("head_dims", head_dims) or ():
        if isinstance(choice, int):
            if choice in allowed:
                kept.append(choice)
            continue
        problem = spec.inputs.head_dims_problem(choice.d, choice.dv)
        if problem:
            raise InvalidArgument("head_dims", [choice.d, choice.dv], f"the kernel's spec forbids this pair: {problem}",
                                  "Drop the pair, or declare the kernel to take it (head_dims or max_head_dim "
                                  "holding D, max_head_dim >= Dv, dv_equals_d=False where Dv != D).")
        kept.append(choice)
    return tuple(kept)
