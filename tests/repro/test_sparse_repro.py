"""A reproducer of an index-set case: the script reads the lists from the tensors file, hands them to the kernel as
``indices`` and takes its exact answer over the keys they name (the index sets' mask_mod copied in). Where
flashcheck cannot be imported it exits 1 on a kernel that reads -1 padding as key 0, and 0 on its fixed twin."""

from __future__ import annotations

import re

import torch

from flashcheck.features.block_lists import BlockLists
from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case, tensors


def _case():
    q, k, v = tensors(Hq=4, Hkv=2, Nq=5, Nk=9, dtype=torch.float32)
    indices = torch.tensor([[3, -1, 7], [8, 8, -1], [-1, -1, -1], [0, 4, 5], [2, -1, 1]], dtype=torch.int32)
    return AttentionCase.create(q, k, v, scale=0.3, causal="bottom_right",
                                variant=Variant(indices=indices.view(1, 1, 5, 3).expand(1, 2, 5, 3).contiguous()))


def test_a_padding_misread_reproduces_without_flashcheck_and_its_fix_does_not(kernel_folder, tmp_path):
    path, verdict = save_case(tmp_path / "corpus", "declared_attention:sparse_padding_as_key_0", _case())
    assert verdict.status == "BUG", verdict
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0 and "BUG" in printed, printed + errors
    script = tmp_path / "out" / "repro.py"
    text = script.read_text()
    assert "def key_set_script" in text and not imports_flashcheck(text)
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "REPRODUCED: " in found.stdout
    rows = {int(m) for m in re.findall(r"out\[0, \d+, (\d+), \d+\]: expected", found.stdout)}
    assert rows and rows <= {0, 1, 2, 4}, found.stdout  # only rows whose lists hold -1 (read as key 0) are wrong
    fixed = run_without_flashcheck(script, "--kernel", "planted_sparse:sparse_fixed", path=kernel_folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "not reproduced: every element within its budget" in fixed.stdout


def _saved_repro(tmp_path, kernel: str, case, kernel_folder):
    """``case`` judged on ``declared_attention:KERNEL`` and saved, its reproducer written and run where flashcheck
    cannot be imported: (verdict, script, the run)."""
    path, verdict = save_case(tmp_path / "corpus", f"declared_attention:{kernel}", case)
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0, printed + errors
    script = tmp_path / "out" / "repro.py"
    assert not imports_flashcheck(script.read_text())
    return verdict, script, run_without_flashcheck(script, path=kernel_folder)


def _agrees_on_the_fixed_twin(script, case, kernel: str, kernel_folder):
    """flashcheck passes the fixed twin ``kernel`` on ``case``, and so does the script run on it."""
    assert check(resolve_kernel(f"declared_attention:{kernel}", device="cpu"), case, device="cpu").status == "PASS"
    fixed = run_without_flashcheck(script, "--kernel", f"planted_block_sparse:{kernel}", path=kernel_folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "not reproduced: every element within its budget" in fixed.stdout, fixed.stdout


def _wrong_rows(stdout: str) -> set:
    """(h, i) of the output elements a reproducer printed as wrong."""
    return {(int(h), int(i)) for h, i in re.findall(r"out\[0, (\d+), (\d+), \d+\]: expected", stdout)}


def _block_case():
    """Blocks of 4 x 4 over 10 queries and 13 keys (3 x 4 blocks, the last of each partial), per query head, the
    first unused entry naming a block the causal alignment shows; trusted full blocks past the causal diagonal."""
    q, k, v = tensors(Hq=2, Hkv=1, Nq=10, Nk=13)
    num = torch.tensor([[[0, 4, 1], [1, 4, 0]]], dtype=torch.int32)
    idx = torch.tensor([[[[0, 1, 3, 2], [3, 0, 2, 1], [2, 0, 3, 1]],
                         [[3, 0, 1, 2], [0, 1, 2, 3], [1, 3, 0, 2]]]], dtype=torch.int32)
    full_num = torch.tensor([[[1, 0, 1], [1, 0, 0]]], dtype=torch.int32)
    full_idx = torch.tensor([[[[3, 0, 0, 0], [0, 0, 0, 0], [1, 0, 0, 0]],
                              [[3, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]]], dtype=torch.int32)
    lists = BlockLists(num, idx, 4, 4, full_num, full_idx, trusted=True)
    return AttentionCase.create(q, k, v, scale=0.3, causal="top_left", variant=Variant(block_lists=lists)), num


def test_a_block_list_count_read_one_too_far_reproduces_and_a_passing_case_does_not(kernel_folder, tmp_path):
    """The script takes its exact answer over the blocks the counts name, trusted full blocks shown past the causal
    diagonal: the kernel that reads one entry past the count is wrong only in query blocks whose count leaves an
    entry to read, and its fixed twin, which flashcheck passes, passes the script too."""
    case, num = _block_case()
    verdict, script, found = _saved_repro(tmp_path, "blocks_past_count", case, kernel_folder)
    assert verdict.status == "BUG", verdict
    assert "def block_list_script" in script.read_text()
    assert found.returncode == 1 and "REPRODUCED: " in found.stdout, found.stdout + found.stderr
    readable = {(h, i) for h in range(2) for i in range(10) if int(num[0, h, i // 4]) < 4}
    assert _wrong_rows(found.stdout) and _wrong_rows(found.stdout) <= readable, found.stdout
    _agrees_on_the_fixed_twin(script, case, "blocks_fixed", kernel_folder)


def _twice_case():
    """One list for both K/V heads, keys repeated up to 3 times, -1 padding, causal bottom-right."""
    q, k, v = tensors(Hq=4, Hkv=2, Nq=5, Nk=9, dtype=torch.float32)
    indices = torch.tensor([[3, 3, 7, -1], [8, 8, 8, 1], [-1, -1, -1, -1], [0, 4, 5, 6], [2, 2, -1, 1]],
                           dtype=torch.int32)
    variant = Variant(indices=indices.view(1, 1, 5, 4), duplicates="twice")
    return AttentionCase.create(q, k, v, scale=0.3, causal="bottom_right", variant=variant)


def test_keys_counted_twice_reproduce_a_kernel_that_counts_them_once_and_a_passing_case_does_not(kernel_folder,
                                                                                                  tmp_path):
    """The script weighs a key listed c times c times its exp: the kernel that counts it once is wrong only in rows
    that repeat a key they see, and its fixed twin, which flashcheck passes, passes the script too."""
    case = _twice_case()
    verdict, script, found = _saved_repro(tmp_path, "twice_counted_once", case, kernel_folder)
    assert verdict.status == "BUG", verdict
    assert "def key_set_weights" in script.read_text()
    assert found.returncode == 1 and "REPRODUCED: " in found.stdout, found.stdout + found.stderr
    assert _wrong_rows(found.stdout) and {i for _, i in _wrong_rows(found.stdout)} <= {0, 1, 4}, found.stdout
    _agrees_on_the_fixed_twin(script, case, "twice_fixed", kernel_folder)
