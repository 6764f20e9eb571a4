"""Test-suite wiring: GPU tests skip without CUDA; without CUDA, Triton runs under its interpreter.

TRITON_INTERPRET has to be set before anything imports triton, so it is decided here, at the root,
before pytest collects any test module.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Imported here (after TRITON_INTERPRET), so that pytester's in-process runs find them among the modules they keep.
# A module imported first inside one run is dropped after it and imported anew by the next, beside the modules kept:
# hypothesis.database then held a second ``not_set`` that the settings made before did not (``TypeError: expected
# str, bytes or os.PathLike object, not UniqueIdentifier``), and a test that set SHRINK_SECONDS on the new
# property_test module was run by the kept plugin's old one.
import hypothesis.database  # noqa: E402,F401

import flashcheck.testing.property_test  # noqa: E402,F401


def _share_the_cores(config) -> None:
    """Under pytest-xdist, N workers on C cores: each worker's thread pools (torch's intra-op pool, OpenMP's,
    BLAS's) get C // N threads, as flashcheck's own ``--jobs`` workers do (flashcheck/campaign/transport.py).

    Set in the controller before it starts the workers, so that each worker (and each process a test starts) reads
    them before it imports numpy or torch. Left as they were, two workers on two cores each ran two threads: the
    oversubscribed pools spun against each other, and an in-process campaign took twice its time. A variable the
    user set wins."""
    workers = getattr(config.option, "numprocesses", None)
    if hasattr(config, "workerinput") or not isinstance(workers, int) or workers < 2:
        return
    from flashcheck.campaign.transport import THREAD_VARIABLES, threads_per_worker

    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, threads_per_worker(workers))


def pytest_configure(config):
    _share_the_cores(config)
    # The documented installs' resolutions wait on the index for a minute: started now, they run beside the tests.
    from tests.docs._resolution import start_for_the_run

    start_for_the_run(config)


def pytest_unconfigure(config):
    from tests.docs._resolution import clean_up

    clean_up(config)


def _shared_folder(tmp_path_factory) -> Path:
    """A folder of this test run that every pytest-xdist worker of it sees (the run's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def signoff_report(tmp_path_factory):
    """``(folder, exit status, report)`` of one small CPU sign-off (tests/_signoff.py), run once per test run:
    the first worker that needs it runs it, the others read its folder (the tests only read it)."""
    from filelock import FileLock

    from tests._signoff import run_signoff

    shared = _shared_folder(tmp_path_factory)
    out, done = shared / "signoff-shared", shared / "signoff-shared.exit"
    with FileLock(str(shared / "signoff-shared.lock")):
        if not done.is_file():
            shutil.rmtree(out, ignore_errors=True)  # a worker that died mid-run left it half written
            out.mkdir()
            code, _ = run_signoff(out)
            done.write_text(str(code))
    return out, int(done.read_text()), json.loads((out / "report.json").read_text())


# The longest tests on a 2-core CPU run (each 10 s to 90 s), first: pytest-xdist then spreads them over its
# workers at the start, and the run ends on short tests instead of one worker finishing a long one alone.
LONGEST_FIRST = (
    "tests/docs/test_commands.py::test_documented_commands_in_a_fresh_clone",
    "tests/robustness/test_variant_campaigns.py",
    "tests/unit/test_fp8.py::test_an_adversarial_campaign",
    "tests/browser/",
    "tests/robustness/test_jobs.py",
    "tests/robustness/test_covering.py",
    "tests/unit/test_flex_dynamic_shapes.py",
    "tests/oracle/test_oracle_audit.py",
    "tests/robustness/test_worker.py",
)


# Last: the test that reads what the resolutions started with the run wrote, by then mostly done.
LAST = ("tests/docs/test_setup_resolution.py::test_every_install_resolves_from_the_package_index_alone",)


def _rank(item) -> int:
    if item.nodeid.startswith(LAST):
        return len(LONGEST_FIRST) + 1
    return next((i for i, prefix in enumerate(LONGEST_FIRST) if item.nodeid.startswith(prefix)), len(LONGEST_FIRST))


def pytest_collection_modifyitems(config, items):
    items.sort(key=_rank)  # stable: the rest keep their order
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the gpu tox environment on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
