"""The sign-off report and the comparison page, opened in headless Chromium: no console error, and every
plot the report made is loaded and visible."""

from __future__ import annotations

import copy
import json

import pytest

from .conftest import open_page

pytestmark = pytest.mark.browser


def _plots(folder) -> list[str]:
    return sorted(p.stem for p in (folder / "plots").glob("*.png"))


def test_the_report_page_shows_every_plot_without_a_console_error(chromium, signoff_report, tmp_path):
    out, _, report = signoff_report
    page = open_page(chromium, out / "index.html", screenshot=tmp_path / "report.png")
    assert page.console_errors == []
    assert page.title == f"flashcheck sign-off: {report['status']}"
    plots = _plots(out)
    assert len(plots) == 4 and len(page.images) == len(plots)
    assert page.broken_images == [] and page.invisible_images == []
    for image in page.images:  # drawn at a readable size, not a thumbnail
        assert image["naturalWidth"] >= 400 and image["width"] >= 300, image
    assert (tmp_path / "report.png").stat().st_size > 0


def test_the_comparison_page_shows_each_reports_heat_map(chromium, signoff_report, tmp_path):
    from flashcheck.cli import main

    out, _, report = signoff_report
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "report.json").write_text(json.dumps(copy.deepcopy(report)))
    assert main(["report", str(out), str(tmp_path / "b"), "--out", str(tmp_path / "cmp")]) == 0
    page = open_page(chromium, tmp_path / "cmp" / "compare.html")
    assert page.console_errors == []
    assert len(page.images) == 2 and page.broken_images == [] and page.invisible_images == []
