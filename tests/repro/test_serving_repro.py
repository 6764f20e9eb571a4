"""Reproducers of the serving forms (varlen, paged, split-KV): the script rebuilds the packed or paged inputs bit for
bit from the tensors file beside it, calls the kernel in its form (at each split count of a split-KV kernel), and
exits 1 on the planted bug where flashcheck cannot be imported, 0 on its fixed twin."""

from __future__ import annotations

import runpy

import pytest
import torch

from flashcheck.contract.formats import raw_bits
from flashcheck.inputs.case import AttentionCase, load_case
from flashcheck.inputs.packing import serving_case

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case

# form, planted kernel, its fixed twin, causal; what the reproducer prints of the bug. The split-KV kernel's NaN
# needs an empty split: 16 splits of a sequence of 3 keys (without causal rows that see no key).
FORMS = {
    "varlen": ("varlen", "varlen_reads_past_end", "varlen_fixed", "bottom_right", "out: "),
    "paged": ("paged", "paged_page_off_by_one", "paged_fixed", "bottom_right", "out: "),
    "split-kv": ("paged", "split_kv_empty_split_nan", "split_kv_fixed", "none", "num_splits=16:\nout: "),
}


def _case(form: str, causal: str = "bottom_right"):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 5, 16, generator=g).to(torch.float16)
    k, v = (torch.randn(3, 2, 24, 16, generator=g).to(torch.float16) for _ in range(2))
    base = AttentionCase.create(q, k, v, scale=0.25, causal=causal)
    return serving_case(base, form=form, packing="ragged", pages="nondividing", poison="huge", seed=1)


@pytest.fixture(scope="module")
def written(kernel_folder, tmp_path_factory):
    """Per form: the saved case's path and flashcheck repro's output folder."""
    out = {}
    for name, (form, planted, _, causal, _) in FORMS.items():
        folder = tmp_path_factory.mktemp(name)
        path, verdict = save_case(folder / "corpus", f"declared_serving:{planted}", _case(form, causal))
        assert verdict.status == "BUG", verdict
        status, printed, errors = repro(path, folder / "out")
        assert status == 0 and "BUG" in printed, printed + errors
        out[name] = path, folder / "out"
    return out


@pytest.mark.parametrize("name", FORMS)
def test_a_planted_serving_bug_reproduces_without_flashcheck_and_its_fix_does_not(name, written, kernel_folder):
    _, planted, fixed, _, shown = FORMS[name]
    out = written[name][1]
    script = out / "repro.py"
    text = script.read_text()
    assert (out / "repro.npz").is_file() and not imports_flashcheck(text)
    assert f"planted_serving:{planted}" in text and "'bits': [" not in text  # the tensors are in the file
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1, found.stdout + found.stderr
    assert shown in found.stdout and "REPRODUCED: " in found.stdout
    if name == "split-kv":  # one and three splits of these sequences leave none empty
        assert "num_splits=1:\nout: every element within its budget" in found.stdout
    again = run_without_flashcheck(script, "--kernel", f"planted_serving:{fixed}", path=kernel_folder)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "not reproduced: every element within its budget" in again.stdout


def test_the_script_rebuilds_the_packed_and_paged_inputs_bit_for_bit(written):
    for name in ("varlen", "paged"):
        path, out = written[name]
        ns = runpy.run_path(str(out / "repro.py"), run_name="repro_under_test")  # its functions, main not run
        x, _ = ns["serving_inputs"]("cpu")
        physical = load_case(path).physical("cpu")
        rebuilt = [x[n] for n in ("q", "k", "v")] + [x["form"][n] for n in physical.kwargs]
        for mine, theirs in zip(rebuilt, [*physical.tensors, *physical.kwargs.values()]):
            if not isinstance(theirs, torch.Tensor):
                assert mine == theirs
                continue
            whole = [torch.empty(0, dtype=t.dtype).set_(t.untyped_storage()) for t in (mine, theirs)]
            assert mine.shape == theirs.shape and mine.stride() == theirs.stride()
            assert torch.equal(raw_bits(whole[0]), raw_bits(whole[1]))  # the poisoned tail past the view too


def test_a_tensors_file_that_is_not_the_scripts_is_refused(written, kernel_folder, tmp_path):
    out = written["varlen"][1]
    (tmp_path / "repro.py").write_text((out / "repro.py").read_text())
    (tmp_path / "repro.npz").write_bytes((written["paged"][1] / "repro.npz").read_bytes())
    result = run_without_flashcheck(tmp_path / "repro.py", path=kernel_folder)
    assert result.returncode == 2 and "cannot run: " in result.stderr and "repro.npz" in result.stderr


def test_the_issue_describes_the_form_and_attaches_the_tensors_file(written):
    issue = (written["varlen"][1] / "ISSUE.md").read_text()
    for part in ("varlen", "q_lens", "cu_seqlens_q", "repro.npz", "## Reproducer"):
        assert part in issue, part
