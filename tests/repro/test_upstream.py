"""The upstream reports (reports/upstream-2026-12-04/): the catalogue names every defect of the results table, its
saved cases and hand-written scripts exist, every committed script is Python that imports no flashcheck and is
hand-written (a generated one is rebuilt, not committed), and a CPU reproducer, written again from its saved case,
exits 1 (reproduced) where flashcheck cannot be imported."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from flashcheck.kernels.registry import resolve_kernel

ROOT = Path(__file__).resolve().parents[2]
REPORTS = ROOT / "reports" / "upstream-2026-12-04"
RESULTS = ROOT / "reports" / "results.md"


def _driver():
    spec = importlib.util.spec_from_file_location("upstream_repros", ROOT / "benchmarks" / "upstream_repros.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


DRIVER = _driver()
CATALOGUE = DRIVER.load_catalogue()


def _defect_rows() -> list[str]:
    """The rows of results.md's table "Defects found in PyTorch and Triton"."""
    section = RESULTS.read_text().split("### Defects found in PyTorch and Triton", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not re.match(r"\| backend \|", line)]


def test_every_row_of_the_results_table_has_an_entry_or_a_reason():
    rows = _defect_rows()
    assert len(rows) >= 20
    named = CATALOGUE["defect"] + CATALOGUE["skipped"]
    for row in rows:
        assert any(e["row"] in row for e in named), f"no catalogue entry or [[skipped]] for: {row[:120]}"
    for entry in named:
        matches = [row for row in rows if entry["row"] in row]
        assert len(matches) == 1, f"{entry.get('slug', 'skipped')}: row {entry['row']!r} matches {len(matches)} rows"
    assert all(s["why"] for s in CATALOGUE["skipped"])


def test_every_entry_has_its_case_or_script():
    slugs = [e["slug"] for e in CATALOGUE["defect"]]
    assert len(slugs) == len(set(slugs))
    for e in CATALOGUE["defect"]:
        assert e["device"] in DRIVER.DEVICES and e["expect"] == 1 and e["backend"]
        assert ("case" in e) != ("script" in e), e["slug"]
        if "case" in e:
            assert (ROOT / e["case"]).is_file() and (ROOT / e["case"]).with_suffix(".npz").is_file(), e["case"]
        else:
            assert {p.name for p in (REPORTS / e["script"]).iterdir()} >= {"repro.py", "ISSUE.md"}, e["script"]


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("script", sorted(REPORTS.glob("*/repro.py")), ids=lambda p: p.parent.name)
def test_committed_scripts_are_python_without_flashcheck(script):
    assert "flashcheck" not in _imports(script)
    assert script.parent.name in {e["script"] for e in CATALOGUE["defect"] if "script" in e}, \
        "a reproducer flashcheck repro writes is rebuilt from its case, not committed"


def test_replay_judges_a_case_the_spec_excludes():
    # Campaigns do not draw negative scales for the CPU flash kernel; its reproducer must still show the NaN.
    assert "negative_scale" in resolve_kernel("torch:flash", device="cpu").spec.excludes


@pytest.mark.parametrize("slug", ["flash-cpu-negative-scale-causal", "flash-cpu-backward-dp-overflow"])
def test_cpu_reproducer_exits_1_without_flashcheck(slug, tmp_path):
    entry = next(e for e in CATALOGUE["defect"] if e["slug"] == slug)
    made = DRIVER.generate(entry, tmp_path / slug, "cpu", timeout=240)
    assert made["rc"] == 0, made["output"][-2000:]
    assert {"repro.py", "repro.npz", "ISSUE.md"} <= {p.name for p in (tmp_path / slug).iterdir()}
    ran = DRIVER.run_script(tmp_path / slug, DRIVER.clean_env(tmp_path / "blocker"), timeout=240)
    assert ran["rc"] == entry["expect"], ran["output"][-2000:]
    assert "REPRODUCED" in ran["output"] and ran["import_flashcheck"].startswith("exit 1")
