"""``flashcheck kernels`` lists every built-in with every option its factory accepts and every planted bug it
has, read from the tables and signatures that resolving a name checks against (not a list of its own)."""

from __future__ import annotations

import inspect
import re

import pytest

from flashcheck.cli import main
from flashcheck.kernels import planted
from flashcheck.kernels.block_sparse import make_block_sparse_kernel
from flashcheck.kernels.flex import make_flex_kernel
from flashcheck.kernels.flex_blocks import make_flex_block_sparse_kernel
from flashcheck.kernels.flex_varlen import make_flex_varlen_kernel
from flashcheck.kernels.fp8_kv_tensor import make_fp8_kv_tensor_kernel
from flashcheck.kernels.registry import BUILTIN_KERNELS
from flashcheck.kernels.sage import make_sage_kernel, make_sage_varlen_kernel
from flashcheck.kernels.serving import make_serving_kernel
from flashcheck.kernels.sparse import make_sparse_kernel
from flashcheck.kernels.triton.forward import make_kernel

# The functions that make the built-ins that take options, and the keywords of theirs that are no option.
FACTORIES = {"torch:flex": make_flex_kernel, "torch:flex-varlen": make_flex_varlen_kernel,
             "torch:block-sparse": make_block_sparse_kernel, "torch:sparse": make_sparse_kernel, "torch:flex-block-sparse": make_flex_block_sparse_kernel,
             "flashcheck:triton": make_kernel, "torch:varlen": make_serving_kernel, "torch:paged": make_serving_kernel,
             "sage:sageattn": make_sage_kernel, "sage:sageattn-varlen": make_sage_varlen_kernel,
             "torch:fp8-kv-tensor": make_fp8_kv_tensor_kernel}
NOT_OPTIONS = {"device", "mutant"}
# Each kernel's planted bugs, from the catalog (the kernels of one form or of fp8 share theirs).
CATALOG = {"flashcheck:triton": planted.TRITON, "flashcheck:triton-varlen": planted.TRITON_VARLEN,
           "flashcheck:triton-paged": planted.PAGED, "flashcheck:triton-split-kv": planted.SPLIT_KV,
           "torch:fp8": planted.FP8, "flashcheck:triton-fp8": planted.FP8_TRITON,
           "flashcheck:triton-fp8-kv-blocks": planted.FP8_KV_BLOCKS, "torch:varlen": planted.VARLEN,
           "torch:paged": planted.PAGED, "torch:split-kv": planted.SPLIT_KV, "torch:mla": planted.MLA,
           "torch:mla-paged": planted.MLA, "torch:mla-fp8": planted.MLA_FP8,
           "flashcheck:triton-mla": planted.TRITON_MLA, "torch:sparse": planted.SPARSE,
           "torch:block-sparse": planted.BLOCK_SPARSE, "torch:sparse-varlen": planted.SPARSE_VARLEN,
           "torch:sparse-paged": planted.SPARSE_PAGED, "torch:mla-sparse": planted.SPARSE_PAGED,
           "flashcheck:triton-sparse": planted.TRITON_SPARSE,
           "flashcheck:triton-block-sparse": planted.TRITON_BLOCK_SPARSE,
           "torch:fp8-kv-token": planted.KV_BLOCK_SCALES[:1], "torch:fp8-kv-blocks": planted.KV_BLOCK_SCALES,
           "torch:fp8-kv-tensor": planted.FP8_KV_TENSOR, "torch:mxfp8": planted.MXFP8, "torch:nvfp4": planted.NVFP4,
           "torch:int8-qk": planted.INT8_QK}
PLANTED = {name: [bug.name for bug in bugs] for name, bugs in CATALOG.items()}


@pytest.fixture(scope="module")
def entries() -> dict:
    """Each kernel's entry in the listing (its lines joined), by name."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernels"]) == 0
    found: dict = {}
    for line in out.getvalue().splitlines():
        if line and not line.startswith(" "):
            name = line.split()[0]
            found[name] = ""
        found[name] += " " + line.strip()
    return found


def test_every_builtin_is_listed(entries):
    assert list(entries) == list(BUILTIN_KERNELS)


@pytest.mark.parametrize("name", FACTORIES)
def test_every_option_a_factory_accepts_is_listed(entries, name):
    params = inspect.signature(FACTORIES[name]).parameters.values()
    options = [p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name not in NOT_OPTIONS]
    listed = re.search(r"options: ((?:\w+, )*\w+)", entries[name])
    assert listed and listed[1].split(", ") == options, entries[name]


def test_kernels_without_options_list_none(entries):
    assert not [name for name in BUILTIN_KERNELS if name not in FACTORIES and "options:" in entries[name]]


@pytest.mark.parametrize("name", PLANTED)
def test_every_planted_bug_is_listed(entries, name):
    assert PLANTED[name] and name in BUILTIN_KERNELS
    listed = re.search(rf"planted bugs \({re.escape(name)}~NAME\): ((?:\w+, )*\w+)", entries[name])
    assert listed and listed[1].split(", ") == PLANTED[name], entries[name]


def test_kernels_without_planted_bugs_list_none(entries):
    assert not [name for name in BUILTIN_KERNELS if name not in PLANTED and "planted bugs" in entries[name]]

