"""The package's layers: each subpackage imports only from its own layer or lower ones, in the order data
flows (docs/design.md, "The layering"), so the numerics never depend on how cases are drawn or run, and the
report never on the campaign's running parts. Read from the source (ast), lazy imports included."""

from __future__ import annotations

import pytest

from ._imports import PACKAGE, Import, expand, imports_of, modules

# Lowest first. A module's layer is its top-level subpackage (or module) under flashcheck.
LAYERS = ("errors", "words", "files", "contract", "features", "numerics", "hypothesis_internals", "inputs", "kernels", "judge",
          "defects", "campaign", "selftest", "report", "repro", "testing", "plugin", "cli")
RANK = {name: i for i, name in enumerate(LAYERS)}
MODULES = modules()


def layer(module: str) -> str:
    return module.split(".")[0]


def upward(module: str, imports: list[Import]) -> list[str]:
    """The imports of ``module`` that reach a higher layer than its own."""
    return [f"line {imp.line}: {target}" for imp in imports for target in expand(imp, set(MODULES))
            if target and RANK[layer(target)] > RANK[layer(module)]]


def private(module: str, imports: list[Import]) -> list[str]:
    """The private names (``_name``) ``module`` takes from other modules."""
    return [f"line {imp.line}: {name} from {imp.target or 'flashcheck'}" for imp in imports for name in imp.names
            if name.startswith("_") and not name.startswith("__") and imp.target != module]


def test_every_module_belongs_to_a_declared_layer():
    unknown = sorted(m for m in MODULES if m and layer(m) not in RANK and not layer(m).startswith("_"))
    assert not unknown, f"add these to LAYERS (and to docs/design.md's layering): {unknown}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m))
def test_no_module_imports_from_a_higher_layer(module):
    found = upward(module, imports_of(MODULES[module]))
    assert not found, f"{module} ({layer(module)}) imports from higher layers: {found}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_private_name_is_imported_from_another_module(module):
    found = private(module, imports_of(MODULES[module]))
    assert not found, f"{module} imports private names: {found}"


def test_the_package_itself_is_only_a_facade():
    # flashcheck/__init__.py names the public API and imports each name on first use: no import at the top
    top = imports_of(PACKAGE / "__init__.py")
    assert not top, f"flashcheck/__init__.py imports {top}: a public name goes in _PUBLIC instead"


def test_the_rules_report_what_they_forbid():
    assert upward("numerics.oracle", [Import("numerics.oracle", "campaign.run", (), 7)]) == ["line 7: campaign.run"]
    assert upward("numerics.oracle", [Import("numerics.oracle", "campaign", ("run",), 7)]) != []
    assert upward("campaign.run", [Import("campaign.run", "numerics.oracle", ("reference_attention",), 3)]) == []
    assert private("judge.check", [Import("judge.check", "judge.diagnose", ("_ranges",), 4)]) != []
    assert private("judge.check", [Import("judge.check", "judge.diagnose", ("which_keys",), 4)]) == []
    # and the reader finds lazy imports inside functions
    assert any(imp.target == "campaign.run" for imp in imports_of(MODULES["cli.fuzz"]))
