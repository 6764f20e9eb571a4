"""pytest plugin of flashcheck, loaded through the ``pytest11`` entry point.

A kernel author's test asks for the ``flashcheck`` fixture and checks cases::

    def test_my_kernel(flashcheck):
        flashcheck.check(my_kernel, case)      # fails the test with the verdict's explanation on BUG

Options share one prefix: ``--flashcheck-device`` (cuda or cpu), ``--flashcheck-json PATH`` (every
verdict of the run, also under pytest-xdist: workers send theirs to the controller). The terminal
summary counts verdicts per kernel and gives the largest error/budget seen.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest

_KEY = "flashcheck_verdicts"


def pytest_addoption(parser):
    group = parser.getgroup("flashcheck", "flashcheck: numerical checks of attention kernels")
    group.addoption("--flashcheck-device", default=None, choices=("cuda", "cpu"),
                    help="device for flashcheck.check (default: cuda when available)")
    group.addoption("--flashcheck-json", default=None, metavar="PATH",
                    help="write every flashcheck verdict of the run to PATH as JSON")


def pytest_configure(config):
    config.stash[_STASH] = []


_STASH = pytest.StashKey[list]()


class FlashcheckFixture:
    """What the ``flashcheck`` fixture gives a test: ``check`` records and asserts verdicts."""

    def __init__(self, config, nodeid: str):
        self._config = config
        self._nodeid = nodeid
        self.device = config.getoption("flashcheck_device")

    def check(self, kernel, case, *, allow_suspicious: bool = True, **options):
        """Check ``kernel`` on ``case``; fail the test on BUG (and on SUSPICIOUS unless allowed)."""
        from .check import check

        verdict = check(kernel, case, device=options.pop("device", self.device), **options)
        record = verdict.as_dict()
        record["test"] = self._nodeid
        self._config.stash[_STASH].append(record)
        if getattr(verdict, "skipped", None):
            pytest.skip(f"flashcheck skipped the case: {verdict.skipped}")
        if verdict.status == "BUG" or (verdict.status == "SUSPICIOUS" and not allow_suspicious):
            pytest.fail(str(verdict), pytrace=False)
        return verdict


@pytest.fixture
def flashcheck(request):
    return FlashcheckFixture(request.config, request.node.nodeid)


def pytest_sessionfinish(session):
    config = session.config
    records = config.stash.get(_STASH, [])
    workeroutput = getattr(config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: hand the verdicts to the controller
        workeroutput[_KEY] = json.dumps(records)
        return
    path = config.getoption("flashcheck_json")
    if path:
        with open(path, "w") as fh:
            json.dump({"verdicts": records}, fh, indent=2, default=str)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist controller: collect a finished worker's verdicts."""
    data = getattr(node, "workeroutput", {}).get(_KEY)
    if data:
        node.config.stash[_STASH].extend(json.loads(data))


def pytest_terminal_summary(terminalreporter, config):
    records = config.stash.get(_STASH, [])
    if not records or getattr(config, "workeroutput", None) is not None:
        return
    by_kernel = defaultdict(lambda: {"PASS": 0, "SUSPICIOUS": 0, "BUG": 0, "max_ratio": 0.0})
    for r in records:
        row = by_kernel[r["kernel"]]
        row[r["status"]] += 1
        ratio = r.get("max_ratio")
        if isinstance(ratio, (int, float)) and math.isfinite(ratio):
            row["max_ratio"] = max(row["max_ratio"], ratio)
    terminalreporter.section("flashcheck")
    for kernel, row in sorted(by_kernel.items()):
        terminalreporter.write_line(
            f"{kernel}: {row['PASS']} PASS, {row['SUSPICIOUS']} SUSPICIOUS, {row['BUG']} BUG; "
            f"max error/budget {row['max_ratio']:.3g}")
