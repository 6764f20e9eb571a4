"""What the Triton interpreter computes wrongly is decided once (kernels/triton/runtime.py): every Triton kernel's
spec on the CPU, flashcheck's and fla-core's, and the registry's reason for leaving a dtype out read it."""

from __future__ import annotations

import importlib.util

import pytest

from flashcheck.kernels import fla
from flashcheck.kernels.registry import dtype_left_out, resolve_kernel
from flashcheck.kernels.triton import runtime
from flashcheck.kernels.triton.forward import make_kernel, on_device

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_bf16_is_left_out_on_the_cpu_alone():
    assert runtime.triton_dtypes("cpu") == ("fp16", "fp32")
    assert runtime.triton_dtypes("cuda") == ("fp16", "bf16", "fp32")


@pytest.fixture
def fp16_wrong(monkeypatch):
    """As if the interpreter computed fp16 wrongly instead: every user must follow."""
    monkeypatch.setattr(runtime, "INTERPRETER_WRONG_DTYPES", {"fp16": "a wrong fp16"})


def test_every_triton_spec_reads_the_one_rule(fp16_wrong):
    assert on_device(make_kernel(), "cpu").spec.dtypes == ("bf16", "fp32")
    assert fla._spec("cpu").dtypes == ("bf16", "fp32")
    assert on_device(make_kernel(), "cuda").spec.dtypes == ("fp16", "bf16", "fp32")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
@pytest.mark.parametrize("name", ["flashcheck:triton-varlen", "flashcheck:triton-paged", "flashcheck:triton-split-kv",
                                  "flashcheck:triton-mla"])
def test_the_serving_forms_triton_kernels_read_it(fp16_wrong, name):
    assert resolve_kernel(name, device="cpu").spec.dtypes == ("bf16", "fp32")


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_the_registry_says_why_from_it(fp16_wrong):
    kernel = resolve_kernel("flashcheck:triton", device="cpu")
    assert [dtype_left_out(kernel, "cpu", d) for d in ("fp16", "bf16")] == ["a wrong fp16", None]
