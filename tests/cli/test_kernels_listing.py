"""``flashcheck kernels`` lists every built-in with every option its factory accepts and every planted bug it
has, read from the tables and signatures that resolving a name checks against (not a list of its own)."""

from __future__ import annotations

import inspect
import re

import pytest

from flashcheck.cli import main
from flashcheck.kernels.flex import make_flex_kernel
from flashcheck.kernels.flex_varlen import make_flex_varlen_kernel
from flashcheck.kernels.fp8 import FP8, FP8_MUTANTS
from flashcheck.kernels.registry import BUILTIN_KERNELS
from flashcheck.kernels.serving import SERVING_MUTANTS, make_serving_kernel
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.fp8 import FP8_TRITON_MUTANTS
from flashcheck.kernels.triton.paged import PAGED_MUTANTS
from flashcheck.kernels.triton.planted import BACKWARD_MUTANTS, MUTANTS
from flashcheck.kernels.triton.planted_long import LONG_MUTANTS
from flashcheck.kernels.triton.planted_variants import VARIANT_BACKWARD_MUTANTS, VARIANT_MUTANTS
from flashcheck.kernels.triton.varlen import VARLEN_MUTANTS
from flashcheck.kernels.split_kv import SPLIT_MUTANTS

# The functions that make the built-ins that take options, and the keywords of theirs that are no option.
FACTORIES = {"torch:flex": make_flex_kernel, "torch:flex-varlen": make_flex_varlen_kernel,
             "flashcheck:triton": make_kernel, "torch:varlen": make_serving_kernel, "torch:paged": make_serving_kernel}
NOT_OPTIONS = {"device", "mutant"}
TRITON = [m.name for m in MUTANTS + BACKWARD_MUTANTS + VARIANT_MUTANTS + VARIANT_BACKWARD_MUTANTS + LONG_MUTANTS]
PLANTED = {"flashcheck:triton": TRITON, "flashcheck:triton-varlen": list(VARLEN_MUTANTS),
           "flashcheck:triton-paged": list(PAGED_MUTANTS), "flashcheck:triton-split-kv": list(SPLIT_MUTANTS),
           FP8: list(FP8_MUTANTS), "flashcheck:triton-fp8": list(FP8_TRITON_MUTANTS),
           **{f"torch:{form}": [m for m, (of, _) in SERVING_MUTANTS.items() if of == form]
              for form in ("varlen", "paged", "split-kv")}}


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

