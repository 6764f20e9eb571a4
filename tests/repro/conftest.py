"""Fixtures of the reproducer tests: the planted kernels copied into a folder of their own (the only folder a
reproducer's subprocess gets on its path), importable here too."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# Each file of planted kernels, and the module name it has in the kernel folder.
COPIES = {"planted.py": "planted_attention", "declared.py": "declared_attention",
          "planted_serving.py": "planted_serving", "declared_serving.py": "declared_serving",
          "planted_merge.py": "planted_merge", "planted_sparse.py": "planted_sparse",
          "planted_block_sparse.py": "planted_block_sparse", "planted_quantized.py": "planted_quantized"}


@pytest.fixture(scope="session")
def kernel_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kernels")
    for source, module in COPIES.items():
        shutil.copy(HERE / source, folder / f"{module}.py")
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))
    for module in COPIES.values():
        sys.modules.pop(module, None)
