"""A reproducer of an index-set case: the script reads the lists from the tensors file, hands them to the kernel as
``indices`` and takes its exact answer over the keys they name (the index sets' mask_mod copied in). Where
flashcheck cannot be imported it exits 1 on a kernel that reads -1 padding as key 0, and 0 on its fixed twin."""

from __future__ import annotations

import re

import torch

from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase

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
