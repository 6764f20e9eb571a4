"""A plain-callable kernel's planted bug reproduces in a process where flashcheck cannot be imported (exit 1, the
wrong element named), and the fixed twin, run by the same script, does not (exit 0): forward and backward. The
tensors are in repro.npz beside the script, whose text does not grow with the case."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.layout import Layout
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.repro import make_repro

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case, tensors


@pytest.fixture(scope="module")
def forward(kernel_folder, tmp_path_factory):
    """A forward case of the one-element bug, and ``flashcheck repro``'s output folder and printout for it."""
    q, k, v = tensors()
    case = AttentionCase.create(q, k, v, scale=0.35, layout="transposed")
    path, verdict = save_case(tmp_path_factory.mktemp("corpus"), "planted_attention:one_element_off", case)
    assert verdict.status == "BUG"
    out = tmp_path_factory.mktemp("forward")
    status, printed, errors = repro(path, out)
    assert status == 0, printed + errors
    return out, printed


def test_the_blocked_process_cannot_import_flashcheck(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import flashcheck\n")
    result = run_without_flashcheck(probe)
    assert result.returncode == 1 and "ModuleNotFoundError" in result.stderr and "flashcheck" in result.stderr


def test_a_planted_forward_bug_reproduces_and_its_fix_does_not(forward, kernel_folder):
    out, printed = forward
    assert "BUG" in printed and "repro.py" in printed
    script = out / "repro.py"
    assert not imports_flashcheck(script.read_text())
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1, found.stdout + found.stderr
    # The bug: the last query row's first column, in every head (Nq = 5: row 4).
    assert "out[0, 0, 4, 0]: expected" in found.stdout and "out[0, 1, 4, 0]" in found.stdout
    assert "REPRODUCED: 2 wrong element(s)" in found.stdout
    assert found.stdout.startswith("versions: torch ") and "kernel package planted_attention" in found.stdout
    assert "flashcheck's diagnosis" in found.stdout and "over_budget" in found.stdout
    fixed = run_without_flashcheck(script, "--kernel", "planted_attention:fixed", path=kernel_folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "not reproduced: every element within its budget" in fixed.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_a_script_that_needs_cuda_exits_2_without_it(forward, kernel_folder):
    result = run_without_flashcheck(forward[0] / "repro.py", "--device", "cuda", path=kernel_folder)
    assert result.returncode == 2 and "cannot run: " in result.stderr and "CUDA" in result.stderr


def test_the_issue_names_versions_case_and_worst_elements(forward):
    issue = (forward[0] / "ISSUE.md").read_text()
    # The sections of the sample issue (this case's, as generated once): regenerate the sample when they change.
    sample = (Path(__file__).parent / "sample" / "ISSUE.md").read_text()
    assert [line for line in issue.splitlines() if line.startswith("## ")] == \
        [line for line in sample.splitlines() if line.startswith("## ")]
    for part in ("## Versions", "| torch |", "## The case", "layout: transposed", "scale: 0.35", "## What is wrong",
                 "| out | [0, 1, 4, 0] |", "## Reproducer", "```python"):
        assert part in issue, part


def test_the_tensors_are_in_the_file_beside_the_script(forward, kernel_folder, tmp_path):
    out, printed = forward
    text = (out / "repro.py").read_text()
    assert (out / "repro.npz").is_file() and "repro.npz" in printed
    assert "'array': 'inputs.q'" in text and "'bits'" not in text and "lzma" not in text
    (tmp_path / "repro.py").write_text(text)  # without its tensors file
    result = run_without_flashcheck(tmp_path / "repro.py", path=kernel_folder)
    assert result.returncode == 2 and "cannot run: " in result.stderr and "repro.npz" in result.stderr


def test_the_script_does_not_grow_with_the_case():
    def lines(n_k):
        q, k, v = tensors(Nq=64, Nk=n_k, D=64, seed=1)
        case = AttentionCase.create(q, k, v, scale=0.125)
        made = make_repro(resolve_kernel("torch:math", device="cpu"), case, device="cpu", case_path="case.json")
        return made.script.count("\n"), len(made.tensors)

    (small, small_file), (large, large_file) = lines(8), lines(2048)
    assert large == small and large_file > 10 * small_file  # the keys went to the file, not the text


def test_a_planted_backward_bug_reproduces_and_its_fix_does_not(kernel_folder, tmp_path):
    q, k, v = tensors(Hq=4, Hkv=2, Nq=6, Nk=6)
    case = AttentionCase.create(q, k, v, scale=0.3, causal="top_left", layout=Layout.strided(pad_n=1, pad_d=2))
    # Decorated (backward=True) in a module that imports flashcheck; the script calls the function underneath.
    path, verdict = save_case(tmp_path / "corpus", "declared_attention:wrong_dv", case, upstream="random")
    assert verdict.status == "BUG" and verdict.ratios["dv"] > 1
    status, _, _ = repro(path, tmp_path / "out")
    script = tmp_path / "out" / "repro.py"
    assert status == 0 and "planted_attention:wrong_dv" in script.read_text()
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1, found.stdout + found.stderr
    assert "dq: every element within its budget" in found.stdout and "dv: " in found.stdout
    assert "dv[0, " in found.stdout and "dO random" in found.stdout
    fixed = run_without_flashcheck(script, "--kernel", "planted_attention:fixed", path=kernel_folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
