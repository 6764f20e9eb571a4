"""A reproducer of a block-scaled fp8 case: the script carries the e8m0 (or e4m3) block scales as their bits and
hands them to the kernel as ``q_block_scales``, ``k_block_scales`` and ``v_block_scales``, and NVFP4's global scales
as ``q_global_scale``, ``k_global_scale`` and ``v_global_scale``. Where flashcheck cannot be imported it exits 1 on a
kernel that reads k's e8m0 scales as e4m3 (or leaves out k's global scale), and 0 on its fixed twin."""

from __future__ import annotations

import pytest

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.recipe import Recipe

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case


@pytest.mark.parametrize("scheme, buggy, fixed, keyword", [
    ("mxfp8", "mx_e8m0_as_e4m3", "mx_fixed", "k_block_scales"),
    ("nvfp4", "nvfp4_k_global_forgotten", "nvfp4_fixed", "k_global_scale")])
def test_a_misread_scale_reproduces_without_flashcheck_and_its_fix_does_not(kernel_folder, tmp_path, scheme, buggy,
                                                                            fixed, keyword):
    case = Recipe(shapes=Shapes(1, 2, 2, 5, 40, 64, 64), dtype="fp8_e4m3", values="random", seed=0,
                  settings={"quantization": scheme}).build()
    path, verdict = save_case(tmp_path / "corpus", f"declared_attention:{buggy}", case)
    assert verdict.status == "BUG", verdict
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0 and "BUG" in printed, printed + errors
    script = tmp_path / "out" / "repro.py"
    assert keyword in script.read_text() and not imports_flashcheck(script.read_text())
    found = run_without_flashcheck(script, path=kernel_folder)
    assert found.returncode == 1 and "REPRODUCED: " in found.stdout, found.stdout + found.stderr
    twin = run_without_flashcheck(script, "--kernel", f"planted_quantized:{fixed}", path=kernel_folder)
    assert twin.returncode == 0, twin.stdout + twin.stderr
