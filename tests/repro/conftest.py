"""Fixtures of the reproducer tests: the planted kernels copied into a folder of their own (the only folder a
reproducer's subprocess gets on its path), importable here too."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def kernel_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernels")
    shutil.copy(HERE / "planted.py", folder / "planted_attention.py")
    shutil.copy(HERE / "declared.py", folder / "declared_attention.py")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for name in ("planted_attention", "declared_attention"):
        sys.modules.pop(name, None)
