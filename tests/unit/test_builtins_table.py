"""The built-in kernels are one table (kernels/builtins.py): the registry's names and descriptions and the
planted-bug names resolving accepts are read from it, so none can drift from another (the options it lists:
tests/cli/test_kernels_listing.py). Its names' prefixes, which no import path may take, are defined once
(kernels/origin.py, read without torch) and every user reads that definition."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import flashcheck.kernels.builtins as table
from flashcheck import BackendUnavailable, InvalidArgument
from flashcheck.cli import options as cli_options
from flashcheck.contract.spec import as_kernel
from flashcheck.kernels import origin
from flashcheck.kernels.builtins import BUILTINS
from flashcheck.kernels.origin import RESERVED_PREFIXES
from flashcheck.kernels.registry import BUILTIN_KERNELS, planted_bugs, resolve_kernel
from flashcheck.repro.calls import kernel_call
from flashcheck.testing.asserts import replay_command
from flashcheck.testing.session import Session


def test_the_registry_names_and_describes_the_table_in_its_order():
    assert list(BUILTIN_KERNELS.items()) == [(entry.name, entry.description) for entry in BUILTINS]
    assert len(BUILTIN_KERNELS) == len(BUILTINS)


@pytest.mark.parametrize("entry", [e for e in BUILTINS if e.planted], ids=lambda e: e.name)
def test_a_planted_bug_is_checked_against_the_table_before_the_kernel_is_made(entry, monkeypatch):
    def refuse(**_):
        raise AssertionError("the factory ran")

    monkeypatch.setitem(table._BY_NAME, entry.name, dataclasses.replace(entry, make=refuse))
    with pytest.raises(InvalidArgument, match=f"no planted bug 'nope' for {entry.name}"):
        resolve_kernel(f"{entry.name}~nope", device="cuda")  # a usage error, on any machine
    assert planted_bugs(entry.name) == tuple(bug.name for bug in entry.planted)


def test_the_reserved_prefixes_are_the_tables():
    assert {name.partition(":")[0] for name in BUILTIN_KERNELS} == set(RESERVED_PREFIXES)


def test_every_user_of_the_reserved_prefixes_reads_the_one_definition(monkeypatch, tmp_path):
    # Reserve one more prefix, of a module imported from a folder of its own: each user must see it.
    monkeypatch.setattr(origin, "RESERVED_PREFIXES", (*RESERVED_PREFIXES, "json"))
    with pytest.raises(InvalidArgument, match="unknown built-in kernel"):
        resolve_kernel("json:dumps", device="cpu")
    kernel = as_kernel(lambda q, k, v, *, scale, causal="none", attn_mask=None: q).reached_as("json:dumps")
    with pytest.raises(InvalidArgument, match="a built-in that plain public code cannot call"):
        kernel_call(kernel, None, device="cpu", case_path="case.json")
    assert origin.kernel_origin(kernel)["kernel_import_root"] is None
    session = Session(invocation_dir=tmp_path)
    assert not replay_command(tmp_path / "case.json", kernel, device="cpu", session=session).startswith("PYTHONPATH")
    added = []
    monkeypatch.setattr(cli_options, "importable_from", added.append)
    cli_options.importable_from_cwd(["json:dumps", "torch:math"])
    assert added == []
    cli_options.importable_from_cwd(["other.lib:attention"])
    assert len(added) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_known_planted_bug_is_refused_where_its_kernel_cannot_run():
    with pytest.raises(BackendUnavailable, match="no CUDA device"):
        resolve_kernel("torch:varlen~reads_past_end", device="cuda")
