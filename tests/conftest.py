"""Test-suite wiring: GPU tests skip without CUDA; without CUDA, Triton runs under its interpreter.

TRITON_INTERPRET has to be set before anything imports triton, so it is decided here, at the root,
before pytest collects any test module.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def signoff_report(tmp_path_factory):
    """``(folder, exit status, report)`` of one small CPU sign-off (tests/_signoff.py), run once per process."""
    from tests._signoff import run_signoff

    out = tmp_path_factory.mktemp("signoff")
    code, report = run_signoff(out)
    return out, code, report


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run the gpu tox environment on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
