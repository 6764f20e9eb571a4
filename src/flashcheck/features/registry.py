"""The features' records, in the order a kernel receives them (:data:`REGISTRY`): the one list the other layers
iterate. Each is the ``FEATURE`` of its module in this package; :mod:`flashcheck.contract.features` lists the
modules and the names (torch-free, for what a command line reads first) and declares the spec flags, so a new
feature is its module and two lines there."""

from __future__ import annotations

from importlib import import_module

from ..contract.features import FEATURES, MODULES
from .base import Feature

__all__ = ["REGISTRY", "by_term", "feature"]

REGISTRY: tuple[Feature, ...] = tuple(import_module(f"{__package__}.{module}").FEATURE for module in MODULES.values())
_BY_NAME = {f.name: f for f in REGISTRY}
# The modules' own names for their features, in the same order as contract.features lists them.
assert tuple(_BY_NAME) == FEATURES, (tuple(_BY_NAME), FEATURES)


def feature(name: str) -> Feature:
    return _BY_NAME[name]


def by_term(term: str) -> tuple[Feature, ...]:
    return tuple(f for f in REGISTRY if f.term == term)
