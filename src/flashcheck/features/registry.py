"""The features' records, in the order a kernel receives them (:data:`REGISTRY`; their names, torch-free, are
:data:`flashcheck.contract.features.FEATURES`): the one list the other layers iterate. A new feature is a
module of this package and a line here (and its spec flag, :class:`~flashcheck.contract.spec.KernelSpec`)."""

from __future__ import annotations

from ..contract.features import FEATURES
from . import alibi, attn_bias, chunk, sinks, softcap, window
from .base import Feature

__all__ = ["REGISTRY", "by_term", "feature"]

REGISTRY: tuple[Feature, ...] = (softcap.FEATURE, alibi.FEATURE, attn_bias.FEATURE, window.FEATURE,
                                 chunk.FEATURE, sinks.FEATURE)
_BY_NAME = {f.name: f for f in REGISTRY}
# contract.features holds the names without importing torch (what a command line reads first): the same list.
assert tuple(_BY_NAME) == FEATURES, (tuple(_BY_NAME), FEATURES)


def feature(name: str) -> Feature:
    return _BY_NAME[name]


def by_term(term: str) -> tuple[Feature, ...]:
    return tuple(f for f in REGISTRY if f.term == term)
