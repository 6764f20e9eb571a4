"""One name, one meaning: the repository's strategies/ folder holds the TOML presets, so no module of flashcheck
is called ``strategies``; ``flashcheck.strategies``, the public name of the hypothesis strategies, is an alias of
``flashcheck.inputs.recipe_draws``."""

from __future__ import annotations

import importlib

from ._imports import PACKAGE, modules


def test_the_presets_folder_alone_is_called_strategies():
    assert (PACKAGE.parents[1] / "strategies").is_dir()
    named = sorted(m for m in modules() if m.split(".")[-1] == "strategies")
    assert not named, f"{named}: strategies/ is the presets' folder; name the module for what it holds"


def test_flashcheck_strategies_is_the_module_of_recipe_draws():
    assert importlib.import_module("flashcheck.strategies") is importlib.import_module("flashcheck.inputs.recipe_draws")
