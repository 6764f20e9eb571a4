"""Running ``flashcheck fuzz`` on a planted kernel from the tests, in this process."""

from __future__ import annotations

import json

from flashcheck.cli import main

K = "tests.robustness._kernels"


def fuzz(tmp_path, kernel: str, *extra, seed: int = 1, name: str = "run"):
    """Exit code and JSON summary of a CPU campaign on ``tests.robustness._kernels:KERNEL``."""
    out = tmp_path / f"{name}.json"
    code = main(["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", str(seed),
                 "--corpus", str(tmp_path / f"{name}-corpus"), "--json", str(out), "--no-progress", *extra])
    return code, json.loads(out.read_text())
