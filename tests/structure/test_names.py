"""One name, one meaning, where two meanings once shared a name:

- "merge" is the merge of split-KV partial states (what ``flashcheck.check_merge`` judges); combining the
  summaries of campaigns run side by side is "combine" (``campaign/combine.py``), though the command that
  does it keeps its name, ``flashcheck merge`` (``cli/merge.py``);
- "serve" and "serving" are the serving forms (paged, varlen, decode); the kernel's worker process is a
  worker (``campaign/worker.py`` and ``campaign/worker_child.py``);
- ``Variant`` is the public case variant (``flashcheck.Variant``); what the self-test judges is a ``Subject``;
- the repository's strategies/ folder holds the TOML presets, so no module of flashcheck is called
  ``strategies``; ``flashcheck.strategies``, the public name of the hypothesis strategies, is an alias of
  ``flashcheck.inputs.recipe_draws``.

Read from the source: module names and the names of functions and classes.
"""

from __future__ import annotations

import ast
import importlib
import re

from ._imports import PACKAGE, modules

MODULES = modules()
# The layers where each word has its meaning; elsewhere it may not name a module, a function or a class.
WORDS = {
    "merge": ("contract.", "numerics.", "inputs.", "kernels.", "judge.", "repro."),
    "serve": ("contract.", "inputs.", "kernels.", "judge.", "repro."),
}
COMMAND_MODULES = {"cli.merge"}  # named after their command
VARIANT_CLASS = "features.variant"


def names_of(source: str) -> list[str]:
    return [node.name for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def words(name: str) -> list[str]:
    """``merge_summaries`` -> merge, summaries; ``MergeCase`` -> merge, case."""
    return [w.lower() for part in name.split("_") for w in re.findall(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])", part)]


def _says(name: str, word: str) -> bool:
    return any(w.startswith(word) for w in words(name))


def misnamed(module: str, source: str) -> list[str]:
    """What ``module`` names with a word whose meaning lives elsewhere, or a second ``Variant``."""
    found = []
    for word, homes in WORDS.items():
        if module.startswith(homes):
            continue
        if _says(module.split(".")[-1], word) and module not in COMMAND_MODULES:
            found.append(f"module {module}")
        found += [f"{module}:{name}" for name in names_of(source) if _says(name, word)]
    if module != VARIANT_CLASS:
        found += [f"{module}:{name}" for name in names_of(source) if name == "Variant"]
    return found


def test_each_name_keeps_its_one_meaning():
    found = [hit for module, path in MODULES.items() if module for hit in misnamed(module, path.read_text())]
    assert not found, f"{found}: see tests/structure/test_names.py for what each word means"


def test_the_rule_sees_a_second_meaning():
    assert misnamed("campaign.merge", "def merge_summaries(): pass") == ["module campaign.merge",
                                                                        "campaign.merge:merge_summaries"]
    assert misnamed("campaign.serve", "def serve(): pass") == ["module campaign.serve", "campaign.serve:serve"]
    assert misnamed("selftest.subjects", "class Variant: pass") == ["selftest.subjects:Variant"]
    assert misnamed("judge.merge", "def check_merge(): pass") == []
    assert misnamed("cli.merge", "def run(): pass") == []
    assert misnamed("campaign.engine", "def observe(): pass") == []
    assert words("MergeCase") == ["merge", "case"] and words("_merge_into") == ["merge", "into"]


def test_the_presets_folder_alone_is_called_strategies():
    assert (PACKAGE.parents[1] / "strategies").is_dir()
    named = sorted(m for m in MODULES if m.split(".")[-1] == "strategies")
    assert not named, f"{named}: strategies/ is the presets' folder; name the module for what it holds"


def test_flashcheck_strategies_is_the_module_of_recipe_draws():
    assert importlib.import_module("flashcheck.strategies") is importlib.import_module("flashcheck.inputs.recipe_draws")
