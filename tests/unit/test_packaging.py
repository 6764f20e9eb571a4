"""What a built wheel holds: every package under src/, and the presets of strategies/ (pyproject.toml
lists the packages by hand, because strategies/ is mapped into the package)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_under_src_is_listed():
    found = {".".join(p.parent.relative_to(ROOT / "src").parts) for p in (ROOT / "src").rglob("__init__.py")}
    listed = set(_setuptools()["packages"])
    assert found == listed - {"flashcheck._presets"}, "add the new package to [tool.setuptools] packages"


def test_the_presets_ship_from_strategies():
    config = _setuptools()
    assert config["package-dir"]["flashcheck._presets"] == "strategies"
    shipped = {p.stem for p in (ROOT / "strategies").glob(config["package-data"]["flashcheck._presets"][0])}
    from flashcheck.inputs.presets import builtin_presets

    assert shipped and shipped == set(builtin_presets())
