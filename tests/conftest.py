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


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the gpu tox environment on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
