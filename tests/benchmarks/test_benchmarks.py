"""benchmarks/bench_work.py and bench_machinery.py on the CPU at small sizes: every axis grows its own dimension by
each factor, each row times the kernel and the whole check, the table it prints has a row per measured case; and
a campaign whose judge costs nothing runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from flashcheck.contract.validation import Shapes

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_work.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_work", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_each_axis_grows_its_own_dimension(bench):
    assert bench.grown("keys", 10, 32, 16) == Shapes(1, 1, 1, 32, 320, 16, 16)
    assert bench.grown("batch", 10, 32, 16) == Shapes(10, 1, 1, 32, 32, 16, 16)
    assert bench.grown("heads", 10, 32, 16) == Shapes(1, 10, 10, 32, 32, 16, 16)
    assert {bench.elements(bench.grown(axis, 10, 32, 16)) for axis in bench.AXES} == {10 * 32 * 32}


def test_rows_time_the_kernel_and_the_check(bench, capsys, tmp_path):
    rows = bench.main(["--device", "cpu", "--factors", "1,4", "--base-n", "16", "--head-dim", "16",
                       "--repeats", "1", "--json", str(tmp_path / "work.json")])
    assert [(r["axis"], r["factor"]) for r in rows] == [(a, f) for a in bench.AXES for f in (1, 4)]
    for r in rows:
        assert r["status"] == "PASS" and r["kernel_s"] > 0 and r["case_s"] > r["kernel_s"], r
        assert r["oracle_s"] > 0 and r["properties_s"] > 0, r
    grown = {r["axis"]: r["elements"] for r in rows if r["factor"] == 4}
    assert set(grown.values()) == {4 * 16 * 16}
    assert capsys.readouterr().out.count("PASS") == len(rows)
    assert (tmp_path / "work.json").exists()


def test_the_machinery_alone_runs_a_campaign_that_judges_nothing(capsys):
    spec = importlib.util.spec_from_file_location("bench_machinery", SCRIPT.parent / "bench_machinery.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    original = module.campaign_run._Campaign.judge_recipe
    try:
        row = module.main(["--seconds", "2", "--preset", "smoke"])
    finally:
        module.campaign_run._Campaign.judge_recipe = original  # the campaign is the real one for every other test
    assert row["cases"] > 10 and row["cases_per_s"] > 0
    assert "a judge that costs nothing" in capsys.readouterr().out
