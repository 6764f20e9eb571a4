"""A reproducer of a block-scaled fp8 case: the script carries the e8m0 block scales as their bits and hands them to
the kernel as ``q_block_scales``, ``k_block_scales`` and ``v_block_scales``. Where flashcheck cannot be imported it
exits 1 on a kernel that reads k's e8m0 scales as e4m3, and 0 on its fixed twin."""

from __future__ import annotations

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case


def test_a_misread_e8m0_scale_reproduces_without_flashcheck_and_its_fix_does_not(kernel_folder, tmp_path):
    case = Recipe(shapes=Shapes(1, 2, 2, 5, 40, 64, 64), dtype="fp8_e4m3", values="random", seed=0,
                  settings={"quantization": "mxfp8"}).build()
    path, verdict = save_case(tmp_path / "corpus", "declared_attention:mx_e8m0_as_e4m3", case)
    assert verdict.status == "BUG", verdict
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0 and "BUG" in printed, printed + errors
    script = tmp_path / "out" / "repro.py"
    assert "k_block_scales" in script.read_text() and not imports_flashcheck(script.read_text())
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1 and "REPRODUCED: " in found.stdout, found.stdout + found.stderr
    fixed = run_without_flashcheck(script, "--kernel", "planted_quantized:mx_fixed", path=kernel_folder)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
