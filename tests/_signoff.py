"""One small CPU sign-off shared by the report tests and the browser test: a correct kernel, and a kernel
with a numerical bug and a layout assumption (forward and, for the correct one, backward)."""

from __future__ import annotations

import json
from pathlib import Path

from flashcheck.cli import main

KERNELS = ("torch:math", "tests.robustness._kernels:assumes_contiguous")


def run_signoff(out: Path, *extra: str) -> tuple[int, dict]:
    code = main(["signoff", *KERNELS, "--backward", "--device", "cpu", "--preset", "smoke", "--max-examples", "30",
                 "--min-cases", "5", "--seed", "1", "--jobs", "1", "--out", str(out), *extra])
    return code, json.loads((out / "report.json").read_text())
