"""The browser harness itself: it must see a good embedded image as good, and a broken image, an uncaught
script error, a missing file and a hidden image as what they are. Otherwise a report test built on it
could pass on a page a person would see broken."""

import base64
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from tests.browser.conftest import open_page

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]


def _png_base64(width_px=120, height_px=90) -> str:
    """A real PNG plot made by matplotlib (no pyplot, no display), base64-encoded."""
    dpi = 30
    fig = Figure(figsize=(width_px / dpi, height_px / dpi), dpi=dpi)
    fig.add_subplot().plot([0, 1, 2], [2, 0, 1])
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    data = buffer.getvalue()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return base64.b64encode(data).decode("ascii")


def _write(tmp_path, body, title="Harness check") -> Path:
    path = tmp_path / "index.html"
    path.write_text(textwrap.dedent(f"""\
        <!doctype html>
        <html lang="en"><head><meta charset="utf-8"><title>{title}</title>
        <style>body {{ font-family: sans-serif; }} img {{ border: 1px solid #888; }}</style>
        </head><body>
        {body}
        </body></html>
        """), encoding="utf-8")
    return path


def test_good_embedded_png_is_loaded_and_visible(chromium, tmp_path):
    page = _write(tmp_path, f'<h1>Report</h1><img alt="a plot" src="data:image/png;base64,{_png_base64()}">'
                            '<script>document.title += " (js ran)";</script>')
    report = open_page(chromium, page)

    assert report.console_errors == []
    assert report.title == "Harness check (js ran)"
    assert len(report.images) == 1
    image = report.images[0]
    assert image["alt"] == "a plot"
    assert image["loaded"], image
    assert (image["naturalWidth"], image["naturalHeight"]) == (120, 90)
    assert image["visible"], image
    assert image["width"] > 0 and image["height"] > 0
    assert report.broken_images == [] and report.invisible_images == []


def test_broken_image_and_script_error_are_detected(chromium, tmp_path):
    good = _png_base64()
    page = _write(tmp_path, f"""
        <img alt="good" src="data:image/png;base64,{good}">
        <img alt="broken" src="data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB-not-a-png">
        <script>throw new Error("boom")</script>
        """)
    report = open_page(chromium, page)

    assert any(e.startswith("pageerror:") and "boom" in e for e in report.console_errors), report.console_errors
    by_alt = {image["alt"]: image for image in report.images}
    assert by_alt["good"]["loaded"] and by_alt["good"]["visible"], by_alt["good"]
    assert not by_alt["broken"]["loaded"], by_alt["broken"]
    assert by_alt["broken"]["naturalWidth"] == 0
    assert [image["alt"] for image in report.broken_images] == ["broken"]


def test_missing_file_console_error_and_hidden_images_are_detected(chromium, tmp_path):
    png = _png_base64()
    page = _write(tmp_path, f"""
        <img alt="missing" src="not-there.png">
        <img alt="display-none" style="display: none" src="data:image/png;base64,{png}">
        <div style="opacity: 0"><img alt="transparent" src="data:image/png;base64,{png}"></div>
        <img alt="visibility-hidden" style="visibility: hidden" src="data:image/png;base64,{png}">
        <img alt="zero-size" style="width: 0; border: 0" src="data:image/png;base64,{png}">
        <div style="height: 4000px"></div>
        <img alt="far-down-lazy" loading="lazy" src="data:image/png;base64,{png}">
        <script>console.error("logged error"); console.warn("only a warning");</script>
        """)
    report = open_page(chromium, page)

    assert "console.error: logged error" in report.console_errors
    assert not any("only a warning" in e for e in report.console_errors)
    assert any(e.startswith("requestfailed:") and "not-there.png" in e for e in report.console_errors)
    by_alt = {image["alt"]: image for image in report.images}
    assert not by_alt["missing"]["loaded"]
    for alt, reason in [("display-none", "display none"), ("transparent", "opacity 0"),
                        ("visibility-hidden", "visibility hidden"), ("zero-size", "zero size")]:
        assert by_alt[alt]["loaded"], by_alt[alt]
        assert not by_alt[alt]["visible"] and reason in by_alt[alt]["hidden_by"], by_alt[alt]
    # Scrolled into view, the lazy image below the fold loads and is measured.
    assert by_alt["far-down-lazy"]["loaded"] and by_alt["far-down-lazy"]["visible"], by_alt["far-down-lazy"]


def test_remote_resources_are_blocked_and_reported(chromium, tmp_path):
    page = _write(tmp_path, '<img alt="remote" src="https://example.invalid/plot.png">')
    report = open_page(chromium, page)

    assert any(e.startswith("requestfailed: https://example.invalid/plot.png") for e in report.console_errors)
    assert not report.images[0]["loaded"]


@pytest.mark.parametrize("ci, outcome, root", [("true", "errors", True), ("", "skipped", True),
                                               ("", "skipped", False), ("true", "errors", False)])
def test_missing_chromium_skips_locally_and_fails_under_ci(tmp_path, ci, outcome, root):
    """Without the browser the fixture skips, except under CI, where a skip would hide a missing install. A
    user who is not root cannot install it (the README's test command then installs nothing): the skip says so."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""\
        import tests.browser.conftest as harness
        harness.CHROMIUM = "/nonexistent/chromium"
        harness._is_root = lambda: {root}
        chromium = harness.chromium
        """))
    (tmp_path / "test_needs_browser.py").write_text("def test_it(chromium):\n    pass\n")
    env = {**os.environ, "CI": ci, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "no:flashcheck",
         "-p", "no:xdist", "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    output = " ".join((result.stdout + result.stderr).split())  # -rs wraps long reasons
    assert f"1 {'error' if outcome == 'errors' else 'skipped'}" in output, output
    assert "apt-get install -y chromium" in output and "pip install playwright" in output, output
    assert "/nonexistent/chromium" in output, output
    assert ("chromium not installed and apt-get needs root" in output) == (not root), output
