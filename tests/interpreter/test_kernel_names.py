"""A kernel's name resolves back to the same kernel: options and planted-bug variants included."""

from __future__ import annotations

import pytest

from flashcheck import InvalidArgument
from flashcheck.kernels.registry import parse_kernel_name, resolve_kernel

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("name", [
    "flashcheck:triton[block_m=32,block_n=16]",
    "flashcheck:triton[block_m=16,block_n=64,input_precision=ieee]",
    "flashcheck:triton~scale_ignored[block_m=32,block_n=32]",
])
def test_names_round_trip(name):
    kernel = resolve_kernel(name, device="cpu")
    assert kernel.name == name
    assert resolve_kernel(kernel.name, device="cpu").name == name


def test_parse():
    assert parse_kernel_name("flashcheck:triton~x[block_m=32,input_precision=ieee]") == (
        "flashcheck:triton", "x", {"block_m": 32, "input_precision": "ieee"})
    assert parse_kernel_name("pkg.mod:fn") == ("pkg.mod:fn", None, {})


@pytest.mark.parametrize("name, words", [
    ("torch:math~scale_ignored", "flashcheck:triton, torch:varlen, torch:paged, torch:split-kv, "
                                 "flashcheck:triton-varlen, flashcheck:triton-paged, flashcheck:triton-split-kv, "
                                 "torch:fp8, flashcheck:triton-fp8, torch:fp8-kv-token, torch:fp8-kv-blocks, "
                                     "torch:fp8-kv-tensor, torch:mxfp8, "
                                 "torch:nvfp4, flashcheck:triton-fp8-kv-blocks, torch:int8-qk, torch:mla, "
                                 "torch:mla-paged, torch:mla-fp8, flashcheck:triton-mla, torch:sparse, "
                                 "torch:sparse-varlen, "
                                 "torch:sparse-paged, torch:mla-sparse, flashcheck:triton-sparse, "
                                 "torch:block-sparse, flashcheck:triton-block-sparse only"),
    ("flashcheck:triton[block_m]", "has no value"),
    ("flashcheck:triton[tile=3]", "tile"),
    ("flashcheck:triton~no_such_mutant", "no_such_mutant"),
])
def test_bad_names(name, words):
    with pytest.raises(InvalidArgument, match=words):
        resolve_kernel(name, device="cpu")
