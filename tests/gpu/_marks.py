"""The marks of tests that run compiled Triton kernels on a CUDA GPU."""

import importlib.util
import os

import pytest
import torch

COMPILED_TRITON = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
                       reason="TRITON_INTERPRET is set (run tests/gpu in a process of its own)"),
]
