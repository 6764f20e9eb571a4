"""Time to the first case: importing flashcheck, and checking a kernel, imports nothing heavy it does not need.

torch._dynamo (with sympy and mpmath) costs about a second and triton a few tenths: a torch:math campaign
has no use for either. Each test runs a fresh interpreter, since this one has imported everything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

HEAVY = ("torch._dynamo", "torch._inductor", "triton", "sympy", "mpmath", "matplotlib", "scipy")

# One case per path that once imported something heavy: bottom-right causal with Nq != Nk
# (torch.nn.attention.bias imports torch._dynamo), and a mask (torch.broadcast_shapes imports sympy).
_CHECK_CASES = """
import torch
from flashcheck import AttentionCase, check
q, k = torch.randn(1, 2, 5, 16).half(), torch.randn(1, 2, 9, 16).half()
for kw in (dict(causal="bottom_right"), dict(attn_mask=torch.rand(5, 9) > 0.3)):
    assert check(KERNEL, AttentionCase.create(q, k, k, scale=0.25, **kw), device="cpu").status == "PASS"
"""


def imported_after(code: str, *, env_extra: dict | None = None) -> set:
    """The modules of HEAVY that a fresh interpreter has imported after running ``code``."""
    report = f"\nimport sys, json; print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(env_extra or {})
    run = subprocess.run([sys.executable, "-c", code + report], env=env, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout.splitlines()[-1]))


def test_importing_flashcheck_and_its_campaign_imports_nothing_heavy():
    assert imported_after("import flashcheck, flashcheck.judge.check, flashcheck.campaign.run, flashcheck.campaign.worker") == set()


def test_checking_torch_math_imports_neither_dynamo_nor_triton():
    code = "from flashcheck.kernels import resolve_kernel\nKERNEL = resolve_kernel('torch:math', device='cpu')"
    assert imported_after(code + _CHECK_CASES) == set()


def test_checking_flashcheck_triton_imports_triton_alone():
    code = "from flashcheck.kernels import resolve_kernel\nKERNEL = resolve_kernel('flashcheck:triton', device='cpu')"
    assert imported_after(code + _CHECK_CASES) == {"triton"}


def test_the_cli_starts_its_kernel_worker_before_importing_torch():
    # `flashcheck fuzz` imports these before it starts the worker process; torch and hypothesis come after,
    # while the worker imports its own (the two overlap). Nor does `import flashcheck` import torch.
    code = ("import flashcheck, flashcheck.cli, flashcheck.campaign.worker, flashcheck.inputs.presets, flashcheck.judge.verdict, "
            "flashcheck.campaign.parallel, flashcheck.campaign.clock, flashcheck.campaign.combine")
    report = "\nimport sys, json; print(json.dumps([m for m in ('torch', 'numpy', 'hypothesis') if m in sys.modules]))"
    run = subprocess.run([sys.executable, "-c", code + report], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == []


def test_public_names_import_on_first_use():
    code = """
import sys
import flashcheck
assert "torch" not in sys.modules
from flashcheck import AttentionCase, check, kernel, PRECISIONS
import flashcheck.judge.check  # the submodule: the package's `check` stays the function
assert flashcheck.check is check and callable(check) and flashcheck.kernel is kernel
assert flashcheck.AttentionCase is AttentionCase and "flash" in PRECISIONS
assert set(flashcheck.__all__) <= set(dir(flashcheck))
try:
    flashcheck.nonesuch
except AttributeError as exc:
    assert "nonesuch" in str(exc)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
    # the submodule imported first (as the campaign does): the package's `check` is still the function
    code = "import flashcheck.judge.check, flashcheck\nassert callable(flashcheck.check)\nprint('ok')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
