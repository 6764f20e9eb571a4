"""Interpreter tests run Triton kernels on CPU tensors through the Triton interpreter.

TRITON_INTERPRET must be set before triton jits anything; the root conftest sets it on machines
without CUDA. On a GPU machine these tests run only when TRITON_INTERPRET=1 was set by the caller
(``tox -e interpreter``), since one process cannot hold both the compiled and interpreted Triton.
Without triton every test here is skipped.
"""

import importlib.util
import os
from pathlib import Path

import pytest

_HERE = Path(__file__).parent
_HAS_TRITON = importlib.util.find_spec("triton") is not None
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config, items):
    if _HAS_TRITON and _INTERPRETED:
        return
    reason = ("triton is not installed (pip install 'flashcheck[cpu]')" if not _HAS_TRITON else
              "Triton is compiling for the GPU in this process; run these with TRITON_INTERPRET=1 "
              "(tox -e interpreter)")
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if _HERE in Path(item.path).parents:
            item.add_marker(skip)
