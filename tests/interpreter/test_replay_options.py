"""``replay --kernel`` that names the case's kernel without the tile options it was found with says so."""

from __future__ import annotations

import pytest

from flashcheck.cli import main
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_values

pytestmark = pytest.mark.interpreter


def _saved(tmp_path, kernel: str):
    q, k, v = make_values("random", shapes=Shapes(1, 1, 1, 4, 4, 16, 16), dtype="fp32", seed=1)
    case = AttentionCase.create(q, k, v, scale=0.25, provenance={"kernel": kernel, "kernel_source": kernel})
    return case.save(tmp_path / "case")[1]


def test_a_kernel_override_that_drops_the_tiles_says_so(tmp_path, capsys):
    path = _saved(tmp_path, "flashcheck:triton[block_m=32,block_n=32]")
    assert main(["replay", str(path), "--kernel", "flashcheck:triton", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "note: the case was found with flashcheck:triton[block_m=32,block_n=32]" in out
    assert "without block_m=32, block_n=32" in out and "--kernel 'flashcheck:triton[block_m=32,block_n=32]'" in out


def test_replaying_as_found_or_on_another_kernel_says_nothing_of_options(tmp_path, capsys):
    path = _saved(tmp_path, "flashcheck:triton[block_m=32,block_n=32]")
    assert main(["replay", str(path), "--device", "cpu"]) == 0
    assert main(["replay", str(path), "--kernel", "torch:math", "--device", "cpu"]) == 0
    assert "note:" not in capsys.readouterr().out
