"""Helpers of the reproducer tests: small cases saved as a campaign saves its findings, ``flashcheck repro`` run
in this process, and a reproducer run in a fresh process where flashcheck cannot be imported."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import torch

from flashcheck.campaign.corpus import save_finding
from flashcheck.cli.main import main
from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.backward import backward_case, check_backward
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel

# Run before the script: flashcheck made unimportable (the editable install's finder removed, the name blocked),
# and proven so (exit 99 otherwise).
PRELUDE = """
import os, sys
sys.modules["flashcheck"] = None
sys.meta_path[:] = [f for f in sys.meta_path if "flashcheck" not in repr(f)]
sys.path[:] = [p for p in sys.path if not os.path.isdir(os.path.join(p or ".", "flashcheck"))]
try:
    import flashcheck
except ImportError:
    pass
else:
    raise SystemExit(99)
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
NOT_BLOCKED = 99


def tensors(*, B=1, Hq=2, Hkv=2, Nq=5, Nk=7, D=8, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, n, D, generator=g).to(dtype) for h, n in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))


def save_case(folder: Path, kernel_name: str, case: AttentionCase, *, upstream: str | None = None):
    """``case`` judged on ``kernel_name`` (its backward with dO regime ``upstream``) and saved as ``flashcheck fuzz``
    saves a finding; returns (json path, verdict)."""
    kernel = resolve_kernel(kernel_name, device="cpu")
    case = case.with_provenance({**case.provenance, "strategy": "random", "seed": 0})
    if upstream is not None:
        case = backward_case(case, upstream=upstream, seed=3)
        verdict = check_backward(kernel, case, device="cpu")
    else:
        verdict = check(kernel, case, device="cpu")
    return save_finding(folder, verdict, case, label="test", kernel=kernel), verdict


def main_output(argv: list) -> tuple[int, str, str]:
    """``flashcheck ARGV`` in this process: (exit status, stdout, stderr)."""
    printed, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(errors):
        status = main(argv)
    return status, printed.getvalue(), errors.getvalue()


def repro(case, out, *more) -> tuple[int, str, str]:
    """``flashcheck repro CASE --out OUT --device cpu`` in this process: (exit status, stdout, stderr)."""
    return main_output(["repro", str(case), "--out", str(out), "--device", "cpu", *more])


def run_without_flashcheck(script: Path, *args, path: Path | None = None) -> subprocess.CompletedProcess:
    """``python script args`` in a fresh process whose only extra import folder is ``path``, flashcheck blocked."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", PRELUDE, str(script), *args], cwd=script.parent,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != NOT_BLOCKED, "flashcheck was importable in the reproducer's process"
    return result


def imports_flashcheck(text: str) -> bool:
    return any(line.lstrip().startswith(("import flashcheck", "from flashcheck")) for line in text.splitlines())
