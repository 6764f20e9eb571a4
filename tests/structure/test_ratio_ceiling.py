"""The largest error/budget ratio flashcheck tells apart is one constant (judge.verdict.RATIO_CEILING): the
campaign's climb towards larger errors stops there and the report's plots draw a non-finite ratio there. No
module writes the number itself."""

from __future__ import annotations

import ast

from flashcheck.judge.verdict import RATIO_CEILING
from flashcheck.report import plots

from ._imports import modules

# Where 1e6 means something else: a precision contract's bound on its exp ulps.
OTHER_MEANINGS = {"contract.precision"}


def literals(source: str, value: float) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and type(node.value) in (int, float) and node.value == value]


def test_the_ceiling_is_written_once():
    found = {name: lines for name, path in modules().items()
             if name not in OTHER_MEANINGS and (lines := literals(path.read_text(), RATIO_CEILING))}
    assert list(found) == ["judge.verdict"], found


def test_the_plots_and_the_campaign_read_it():
    assert plots.CEILING is RATIO_CEILING
    assert "RATIO_CEILING" in (modules()["campaign.run"].read_text())
