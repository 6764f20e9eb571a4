"""Hypothesis's internals behind one module: ``flashcheck/hypothesis_internals.py`` is the only module that imports
``hypothesis.internal``, or takes a name hypothesis does not export, or touches a private hypothesis name
(``_hypothesis_internal_*`` attributes, ``providers._get_local_constants``). Its internals were tested with
the versions of its ``TESTED`` range, which ``pyproject.toml`` pins, and the installed hypothesis must be one."""

from __future__ import annotations

import ast
import importlib
import tomllib
import warnings

import hypothesis
import pytest

from flashcheck.hypothesis_internals import TESTED, UntestedHypothesis, warn_if_untested

from ._imports import PACKAGE, modules

BOUNDARY = "hypothesis_internals"
# The modules of hypothesis's public API; a name taken from one with an __all__ must be in it.
PUBLIC_MODULES = ("hypothesis", "hypothesis.strategies", "hypothesis.database", "hypothesis.errors",
                  "hypothesis.stateful")


def _hypothesis_module(name: str | None) -> bool:
    return name is not None and (name == "hypothesis" or name.startswith("hypothesis."))


def _public_module(name: str) -> bool:
    private = any(part.startswith("_") for part in name.split("."))
    return name in PUBLIC_MODULES or (name.startswith("hypothesis.extra.") and not private)


def _public_name(module: str, name: str) -> bool:
    if name.startswith("_") and not name.startswith("__"):
        return False
    if _public_module(f"{module}.{name}"):  # from hypothesis import strategies
        return True
    exported = getattr(importlib.import_module(module), "__all__", None)
    return exported is None or name in exported


def reaches(source: str) -> list[str]:
    """Where ``source`` reaches past hypothesis's public API."""
    tree = ast.parse(source)
    found, bound = [], set()  # bound: the names the module gave hypothesis's modules and members
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in (a for a in node.names if _hypothesis_module(a.name)):
                if not _public_module(alias.name):
                    found.append(f"line {node.lineno}: import {alias.name}")
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and not node.level and _hypothesis_module(node.module):
            if not _public_module(node.module):
                found.append(f"line {node.lineno}: from {node.module} import ...")
            found += [f"line {node.lineno}: {a.name} from {node.module}" for a in node.names
                      if _public_module(node.module) and not _public_name(node.module, a.name)]
            bound.update(a.asname or a.name for a in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (node.attr.startswith("_hypothesis") or (
                isinstance(node.value, ast.Name) and node.value.id in bound and node.attr.startswith("_")
                and not node.attr.startswith("__"))):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("_hypothesis"):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("module", sorted(m for m in modules() if m != BOUNDARY))
def test_no_module_but_the_boundary_reaches_into_hypothesis(module):
    found = reaches(modules()[module].read_text())
    assert not found, (f"flashcheck.{module} reaches into hypothesis's internals: {found}. Do it in "
                       f"flashcheck/{BOUNDARY}.py, with a fallback for a hypothesis without them.")


def test_the_rule_sees_each_way_into_the_internals():
    assert reaches("from hypothesis.internal.conjecture.data import ConjectureData") != []
    assert reaches("import hypothesis.internal.reflection") != []
    assert reaches("from hypothesis.control import BuildContext") != []
    assert reaches("from hypothesis.database import choices_to_bytes") != []  # not in its __all__
    assert reaches("from hypothesis import _settings") != []
    assert reaches("def f(t):\n    t._hypothesis_internal_use_settings = 1") != []
    assert reaches("getattr(t, '_hypothesis_internal_database_key', None)") != []
    assert reaches("from hypothesis import settings\nsettings._current_profile") != []
    # and lets the public API through
    assert reaches("from hypothesis import HealthCheck, given, settings, seed as s\n"
                   "from hypothesis import strategies as st\nfrom hypothesis.errors import Flaky\n"
                   "from hypothesis.database import InMemoryExampleDatabase\n"
                   "from hypothesis.extra.redis import RedisExampleDatabase\nimport hypothesis\n"
                   "settings.default.database\nhypothesis.__version_info__\nx._private") == []


def test_the_boundary_is_the_module_that_holds_the_internals():
    assert reaches((PACKAGE / f"{BOUNDARY}.py").read_text()) != []


def test_the_installed_hypothesis_is_a_tested_version():
    problem = TESTED.problem(hypothesis.__version_info__)
    assert problem is None, problem


def test_pyproject_pins_the_tested_range():
    dependencies = tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = [d for d in dependencies if d.startswith("hypothesis")]
    assert pinned == [TESTED.requirement], (
        f"pyproject.toml pins {pinned}, flashcheck/{BOUNDARY}.py's TESTED is {TESTED.requirement}: "
        "change both together")


@pytest.mark.parametrize("version", [(6, 134, 0), (6, 152, 8), (6, 171, 0), (7, 0, 0)])
def test_an_untested_version_warns_with_the_range_and_what_to_do(version):
    with pytest.warns(UntestedHypothesis) as caught:
        assert warn_if_untested(version)
    message = str(caught[0].message)
    assert TESTED.requirement in message and ".".join(map(str, version)) in message and "pip install" in message


@pytest.mark.parametrize("version", [TESTED.low, (6, 170, 27)])
def test_a_tested_version_does_not_warn(version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not warn_if_untested(version)
