"""The variants of generated cases: the named regime of each feature (each feature's module lists its own,
:mod:`flashcheck.features`), drawn into a :class:`~flashcheck.features.variant.Variant` from the recipe's seed."""

from __future__ import annotations

import dataclasses

from ..contract.validation import Shapes
from ..errors import InvalidArgument
from ..features.registry import REGISTRY
from ..features.variant import Variant
from .drawing import seeded

__all__ = ["VARIANT_REGIMES", "fit_to_values", "make_variant"]

VARIANT_REGIMES: dict[str, dict] = {f.name: f.regimes for f in REGISTRY}


def make_variant(regimes: dict[str, str], *, shapes: Shapes, seed: int, drawing: dict | None = None,
                 **settings) -> Variant:
    """The :class:`Variant` of the named regime of each feature (``regimes``: feature -> regime name), drawn with
    the recipe's settings ``drawing`` (a bias's dtype: fp32 where not given), with the Variant's ``settings`` as the
    kernel's spec asks them (:func:`~flashcheck.features.variant.settings_of`; the Variant's defaults where not
    given)."""
    drawing = {"bias_dtype": "fp32", **{k: v for k, v in (drawing or {}).items() if v is not None}}
    gen = seeded(int(seed) + 3)
    parts = {}
    for feature in REGISTRY:
        name = regimes.get(feature.name, "none")
        table = feature.regimes
        if name not in table:
            raise InvalidArgument(f"{feature.name} regime", name, f"unknown {feature.name} regime",
                                  f"Use one of {list(table)}.")
        if table[name] is None:
            continue
        parts[feature.name] = feature.draw(name, table[name], gen, shapes, drawing)
    return Variant(**parts, **settings)


def fit_to_values(regimes: dict[str, str], variant: Variant, q, k, scale: float):
    """(variant, k) with each feature whose regime is drawn with the values (``Feature.fitted``) rebuilt from q, k
    and the scale: a regime that places keys at ties of the logits needs the logits."""
    for feature in REGISTRY:
        fit = feature.fitted.get(regimes.get(feature.name, "none"))
        if fit is not None:
            value, k = fit(getattr(variant, feature.name), q, k, scale)
            variant = dataclasses.replace(variant, **{feature.name: value})
    return variant, k
