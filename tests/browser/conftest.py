"""Headless Chromium for tests of the self-contained HTML report (one index.html, inline CSS and JS,
images embedded as base64 PNG).

The browser is Debian's chromium (``apt-get install -y chromium``: /usr/bin/chromium) driven by
Playwright's sync API (``pip install playwright``). ``playwright install`` is never run: it downloads
browser builds from a CDN this project's machines cannot reach.

* ``chromium``: the launched Browser, one per test process (each pytest-xdist worker has its own). Without
  chromium or playwright the tests using it are skipped, and fail under CI (CI=true). The README's test
  command installs chromium only as root; as another user the skip says that apt-get needs root.
* ``open_page(browser, path)``: loads a file in a fresh browser context and returns a ``PageReport``:
  the title, the console errors / uncaught page errors / failed requests, and each <img> measured.

Why the fixture is package-scoped rather than session-scoped: between two calls of the sync API,
Playwright leaves its own event loop registered as the thread's *running* loop
(``asyncio.get_running_loop()`` returns it and ``asyncio.run()`` raises "cannot be called from a running
event loop"). A session-scoped browser would leak that into every test that the same worker runs after
the first browser test. Package scope stops Playwright when the worker leaves tests/browser; the browser
is still launched once per worker, since pytest and xdist run a package's tests one after another.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Where the README's test command finds it (`command -v chromium`), else where Debian's package puts it.
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

# Headless Chromium as root in a container without network: no sandbox (it cannot start as root),
# no GPU process, and none of the background fetches (QUIC, component updates, sync, first-run pages).
# Playwright's launch() adds a fresh temporary --user-data-dir and removes it on close.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

INSTALL_HINT = ("install them with `apt-get update && apt-get install -y chromium` (Debian's chromium, "
                f"which gives {CHROMIUM}) and `pip install playwright` (or `pip install -e '.[test]'`); "
                "do not run `playwright install`, the tests launch the system chromium")

LOAD_TIMEOUT_MS = 30_000
IMAGE_TIMEOUT_MS = 10_000
VIEWPORT = {"width": 1280, "height": 900}


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _is_root() -> bool:
    return os.geteuid() == 0


def _missing() -> list[str]:
    missing = []
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        missing.append(f"{CHROMIUM} (Debian package chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the Python package playwright")
    return missing


@pytest.fixture(scope="package")
def chromium():
    """Debian's headless Chromium, launched through Playwright's sync API; closed when the package's
    tests are done in this process."""
    missing = _missing()
    if missing:
        message = f"browser tests need {' and '.join(missing)}: {INSTALL_HINT}"
        if not _is_root() and any(CHROMIUM in item for item in missing):
            # The README's test command installs chromium only as root: say why it is still missing.
            message = (f"chromium not installed and apt-get needs root (this user is uid {os.geteuid()}): "
                       f"ask for chromium to be installed, or run the test command as root. {message}")
        if _in_ci():
            pytest.fail(f"CI is set, so not skipping: {message}", pytrace=False)
        pytest.skip(message)

    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        try:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
                                                 timeout=60_000)
        except PlaywrightError as exc:
            # The binary is there but does not start (missing libraries, a broken install): that is an
            # error to see, not a skip.
            pytest.fail(f"{CHROMIUM} did not start under Playwright: {exc}\n{INSTALL_HINT}", pytrace=False)
        try:
            yield browser
        finally:
            browser.close()
    finally:
        playwright.stop()


@dataclass
class PageReport:
    """What a person would see of one page, measured in the browser."""

    title: str
    # console.error messages ("console.error: ..."), uncaught exceptions ("pageerror: ..."),
    # and requests that failed ("requestfailed: URL (net::ERR_...)"), in the order they came.
    console_errors: list[str] = field(default_factory=list)
    # One dict per <img> in document order: alt, src (shortened), loaded (complete and naturalWidth > 0),
    # naturalWidth, naturalHeight, width, height (bounding box in CSS px), visible, and why not
    # ("hidden_by": display none / not in layout / zero size / visibility hidden / opacity 0).
    images: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    @property
    def broken_images(self) -> list[dict[str, Any]]:
        return [image for image in self.images if not image["loaded"]]

    @property
    def invisible_images(self) -> list[dict[str, Any]]:
        return [image for image in self.images if not image["visible"]]


# Scrolls image i into view, waits until it is complete (load or error, or the timeout: lazy images
# start loading only once scrolled to), decodes it, and measures it after the next frame.
_MEASURE_IMAGE = """
async ([index, timeoutMs]) => {
  const img = document.querySelectorAll("img")[index];
  img.scrollIntoView({block: "center", inline: "center"});
  if (!img.complete) {
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, timeoutMs);
      const done = () => { clearTimeout(timer); resolve(); };
      img.addEventListener("load", done, {once: true});
      img.addEventListener("error", done, {once: true});
    });
  }
  if (img.complete && img.naturalWidth > 0) {
    try { await img.decode(); } catch (e) { /* broken or not decodable: naturalWidth says so */ }
  }
  await new Promise((resolve) => requestAnimationFrame(() => resolve()));

  const rect = img.getBoundingClientRect();
  const style = getComputedStyle(img);
  const hiddenBy = [];
  let node = img;
  let displayed = true, transparent = false;
  while (node && node.nodeType === Node.ELEMENT_NODE) {
    const s = getComputedStyle(node);
    if (s.display === "none") displayed = false;
    if (parseFloat(s.opacity) === 0) transparent = true;
    node = node.parentElement;
  }
  if (!displayed) hiddenBy.push("display none");
  if (img.getClientRects().length === 0) hiddenBy.push("not in layout");
  if (!(rect.width > 0 && rect.height > 0)) hiddenBy.push("zero size");
  if (style.visibility !== "visible") hiddenBy.push("visibility " + style.visibility);
  if (transparent) hiddenBy.push("opacity 0");
  if (typeof img.checkVisibility === "function" && hiddenBy.length === 0 &&
      !img.checkVisibility({checkOpacity: true, checkVisibilityCSS: true})) {
    hiddenBy.push("checkVisibility false");
  }
  const src = img.getAttribute("src") || "";
  return {
    alt: img.getAttribute("alt"),
    src: src.length > 80 ? src.slice(0, 60) + "...(" + src.length + " chars)" : src,
    complete: img.complete,
    loaded: img.complete && img.naturalWidth > 0,
    naturalWidth: img.naturalWidth,
    naturalHeight: img.naturalHeight,
    width: rect.width,
    height: rect.height,
    visible: hiddenBy.length === 0,
    hidden_by: hiddenBy,
  };
}
"""


def open_page(browser, path, *, screenshot: str | os.PathLike | None = None) -> PageReport:
    """Load ``path`` (an HTML file) as file:// in a fresh context of ``browser`` and report on it.

    Waits for the load event, then for each <img> in turn: scrolls it into view, waits until it is
    complete (a failure is recorded as ``loaded: False``, not raised) and measures it. Requests to
    http(s)/ws(s) are aborted, so a report that is not self-contained shows them as failed requests on
    any machine. ``screenshot``: where to save a full-page PNG, if given.
    """
    url = Path(path).resolve().as_uri()
    errors: list[str] = []
    context = browser.new_context(viewport=VIEWPORT, service_workers="block")
    try:
        context.route(lambda u: u.startswith(("http://", "https://", "ws://", "wss://")),
                      lambda route: route.abort("blockedbyclient"))
        page = context.new_page()
        page.on("console", lambda message: errors.append(f"console.error: {message.text}")
                if message.type == "error" else None)
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error.name}: {error.message}"))
        page.on("requestfailed", lambda request: errors.append(
            f"requestfailed: {_short(request.url)} ({request.failure})"))
        page.goto(url, wait_until="load", timeout=LOAD_TIMEOUT_MS)
        count = page.evaluate("document.querySelectorAll('img').length")
        images = [page.evaluate(_MEASURE_IMAGE, [i, IMAGE_TIMEOUT_MS]) for i in range(count)]
        if screenshot is not None:
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(screenshot), full_page=True)
        title = page.title()
        # One more round trip, so that events the page sent before it have been dispatched.
        page.evaluate("0")
        return PageReport(title=title, console_errors=list(errors), images=images, url=url)
    finally:
        context.close()


def _short(url: str) -> str:
    return url if len(url) <= 100 else url[:80] + f"...({len(url)} chars)"
