"""Adversarial physical forms for a logical batch: sequence lengths, and the layout each form draws.

A recipe names a length regime (:data:`LENGTH_REGIMES`), the form's own regime where it has one (a page regime,
:data:`PAGE_REGIMES`; a key-use regime, :data:`SEQUSED_REGIMES`) and a poison; :func:`serving_case` turns them,
with the recipe's seed, into a :class:`~flashcheck.inputs.serving.ServingCase` over the dense case the recipe
built, the form's record (:mod:`flashcheck.features.forms`) drawing its layout.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..contract.forms import check_serving_form
from ..errors import InvalidArgument
from ..features import forms
from ..features.registry import REGISTRY
from .case import AttentionCase
from .serving import ServingCase

__all__ = ["LENGTH_REGIMES", "PAGE_REGIMES", "SEQUSED_REGIMES", "serving_case"]

# Simplest first (hypothesis shrinks towards the start).
LENGTH_REGIMES = ("full", "ragged", "empty_sequences", "single_tokens", "fewer_tokens_than_batch", "padded_max")
# The forms' own regimes, by the recipe field that names them.
PAGE_REGIMES, SEQUSED_REGIMES = forms.regimes("pages"), forms.regimes("seqused")


def _lengths(regime: str, batch: int, limit: int, rng: np.random.Generator) -> list[int]:
    if regime in ("full",):
        return [limit] * batch
    if regime in ("ragged", "padded_max"):
        return rng.integers(1, limit + 1, batch).tolist()
    if regime == "empty_sequences":  # one empty, the others anywhere from 0 up, one of them not (a batch of 1: none)
        out = rng.integers(0, limit + 1, batch).tolist()
        empty = int(rng.integers(batch))
        out[empty] = 0
        if batch > 1:
            kept = (empty + 1 + int(rng.integers(batch - 1))) % batch
            out[kept] = max(out[kept], 1)
        return out
    if regime == "single_tokens":
        return [1] * batch
    if regime == "fewer_tokens_than_batch":  # fewer tokens in all than sequences (a batch of 1: one), most empty
        out = [0] * batch
        for b in rng.choice(batch, size=max(1, (batch - 1) // 2), replace=False).tolist():
            out[b] = 1
        return out
    raise InvalidArgument("packing", regime, "unknown length regime", f"Use one of {list(LENGTH_REGIMES)}.")


def _into_sequences(base: AttentionCase, k_lens: list[int]) -> AttentionCase:
    """``base`` with each feature that names key positions moved into each sequence's own keys (an index set drawn
    over the padded keys lists positions of its sequence)."""
    moved = {f.name: f.into_sequences(getattr(base.variant, f.name), base.shapes.n_k, k_lens) for f in REGISTRY
             if f.into_sequences is not None and getattr(base.variant, f.name) is not None}
    return dataclasses.replace(base, variant=base.variant.replace(**moved)) if moved else base


def serving_case(base: AttentionCase, *, form: str, packing: str, pages: str, poison: str, seed: int,
                 same_lengths: bool = False, seqused: str = "none") -> ServingCase:
    """The serving-form case over ``base`` that the regimes and ``seed`` name (``same_lengths``: each sequence's
    query count is its key count, for kernels whose spec says ``equal_lengths``; ``seqused``: a varlen case's
    regime of :data:`SEQUSED_REGIMES`)."""
    rng = np.random.default_rng([seed, 0x5E_4F])
    s = base.shapes
    check_serving_form(form)
    k_lens = _lengths(packing, s.batch, s.n_k, rng)
    base = _into_sequences(base, k_lens)
    record = forms.form(form)
    regime = {"pages": pages, "seqused": seqused}[record.pool]
    layout = record.layout(forms.LayoutDraw(rng, s, k_lens, packing, regime, same_lengths,
                                            lambda limit: _lengths(packing, s.batch, limit, rng)))
    return ServingCase(base, form, k_lens=k_lens, poison=poison, **layout)
