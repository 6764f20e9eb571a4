"""The variants of generated cases: the named regime of each feature (each feature's module lists its own,
:mod:`flashcheck.features`), drawn into a :class:`~flashcheck.features.variant.Variant` from the recipe's seed."""

from __future__ import annotations

from ..contract.validation import Shapes
from ..errors import InvalidArgument
from ..features.registry import REGISTRY
from ..features.variant import Variant
from .drawing import seeded

__all__ = ["VARIANT_REGIMES", "make_variant"]

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
