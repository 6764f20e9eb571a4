"""check_merge findings as saved cases and reproducers: save_dir keeps the states of a failing case (one per set of
finding kinds) bit for bit, and flashcheck repro turns them into a script that calls the merge (folded pairwise for
a two-state merge), exits 1 on the planted bug where flashcheck cannot be imported and 0 on its fixed twin."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.formats import raw_bits
from flashcheck.inputs.merge_case import load_merge_case
from flashcheck.inputs.merge_states import draw_states

from ._repro import imports_flashcheck, repro, run_without_flashcheck

# The planted merge, its convention and dtype, the fixed twin; what the reproducer prints of the bug.
MERGES = {
    "pair": ("pair_lse_not_updated", "pair", "fp16", "pair_fixed", "lse: "),
    "states": ("states_nan_on_empty", "states", "bf16", "states_fixed", "out: "),
}


@pytest.fixture(scope="module")
def saved(kernel_folder, tmp_path_factory):
    """Per merge: its verdict and the folder its failing states were saved in."""
    import planted_merge

    out = {}
    for name, (planted, convention, dtype, _, _) in MERGES.items():
        folder = tmp_path_factory.mktemp(name)
        verdict = flashcheck.check_merge(getattr(planted_merge, planted), convention=convention, dtype=dtype,
                                         cases=16, save_dir=folder)
        assert verdict.status == "BUG", verdict
        out[name] = verdict, folder
    return out


def test_a_failing_case_is_saved_once_per_set_of_kinds_and_named_in_the_verdict(saved):
    verdict, folder = saved["pair"]
    paths = sorted(folder.glob("*.json"))
    named = {f.details.get("case") for f in verdict.findings} - {None}  # the findings of the saved cases
    assert paths and named == set(map(str, paths)) and len(verdict.findings) > len(named)
    assert any("flashcheck repro" in note and str(paths[0]) in note for note in verdict.notes)
    case = load_merge_case(paths[0])
    assert case.provenance["merge_source"] == "planted_merge:pair_lse_not_updated"
    assert case.conventions.convention == "pair" and case.outs.dtype == torch.float16
    p = case.provenance
    splits = case.outs.shape[0]
    outs, lses = draw_states(p["regime"], seed=p["seed"], splits=splits, rows=8, head_dim=64, dtype=torch.float16)
    assert torch.equal(raw_bits(case.outs), raw_bits(outs)) and torch.equal(raw_bits(case.lses), raw_bits(lses))


def test_states_a_merge_passes_are_not_saved(tmp_path, kernel_folder):
    import planted_merge

    verdict = flashcheck.check_merge(planted_merge.pair_fixed, convention="pair", cases=8, save_dir=tmp_path)
    assert verdict.status == "PASS" and not list(tmp_path.iterdir()) and not verdict.notes


@pytest.mark.parametrize("name", MERGES)
def test_a_planted_merge_bug_reproduces_without_flashcheck_and_its_fix_does_not(name, saved, kernel_folder, tmp_path):
    planted, _, _, fixed, shown = MERGES[name]
    case = sorted(saved[name][1].glob("*.json"))[0]
    status, printed, errors = repro(case, tmp_path)
    assert status == 0 and "BUG" in printed, printed + errors
    script = tmp_path / "repro.py"
    text = script.read_text()
    assert (tmp_path / "repro.npz").is_file() and not imports_flashcheck(text) and f"planted_merge:{planted}" in text
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1, found.stdout + found.stderr
    assert shown in found.stdout and "REPRODUCED: " in found.stdout
    again = run_without_flashcheck(script, "--kernel", f"planted_merge:{fixed}", path=kernel_folder)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "not reproduced: every element within its budget" in again.stdout
    issue = (tmp_path / "ISSUE.md").read_text()
    assert "merge" in issue and "repro.npz" in issue and "## Reproducer" in issue


def test_a_merge_case_given_to_replay_is_named_for_what_it_is(saved, tmp_path):
    from ._repro import main_output

    case = sorted(saved["states"][1].glob("*.json"))[0]
    status, _, errors = main_output(["replay", str(case), "--device", "cpu"])
    assert status == 2 and "the states of a merge" in errors and "flashcheck repro" in errors


def test_states_of_a_merge_without_an_import_path_ask_for_one(tmp_path):
    def local_merge(outs, lses):  # defined here: no path another process can import
        return outs[0], lses[0]

    verdict = flashcheck.check_merge(local_merge, cases=2, save_dir=tmp_path / "saved")
    case = sorted((tmp_path / "saved").glob("*.json"))[0]
    assert verdict.status == "BUG" and load_merge_case(case).provenance["merge_source"] is None
    status, _, errors = repro(case, tmp_path / "out")
    assert status == 2 and errors.startswith(f"flashcheck: error: CASE='{case}'") and "module:function" in errors
    assert "None" not in errors
