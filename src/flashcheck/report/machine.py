"""What a sign-off ran on: the machine, the libraries underneath, and flashcheck's own version and commit."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from .. import __version__

__all__ = ["flashcheck_version", "machine_info"]


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(argv: list[str], cwd: Path | None = None) -> str | None:
    """A command's first line of output, or None when it is missing or fails."""
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else None


SOURCE_COMMIT = "FLASHCHECK_SOURCE_COMMIT"  # the commit of a copy of the source that is no git checkout


def flashcheck_version() -> dict:
    """The version, and the git commit of the checkout the package runs from. ``$FLASHCHECK_SOURCE_COMMIT``,
    when set, names it instead: a copy of the source on a CI machine or a remote runner may have no .git,
    or a stale one."""
    version = _version("flashcheck") or __version__
    if os.environ.get(SOURCE_COMMIT):
        return {"version": version, "commit": os.environ[SOURCE_COMMIT], "dirty": None}
    source = Path(__file__).resolve().parents[1]
    commit, dirty = _run(["git", "rev-parse", "HEAD"], cwd=source), None
    if commit is not None:
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                                capture_output=True, text=True, timeout=20)
        dirty = bool(status.stdout.strip())
    return {"version": version, "commit": commit, "dirty": dirty}


def _gpus() -> list[dict]:
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append({"name": p.name, "memory_gib": round(p.total_memory / 2**30, 1),
                    "capability": f"{p.major}.{p.minor}"})
    return out


def machine_info(device: str) -> dict:
    """The machine and library versions a report names: GPU, driver, CUDA, cuDNN, torch, triton, ..."""
    cuda = torch.device(device).type == "cuda" and torch.cuda.is_available()
    cudnn = torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None
    return {
        "device": str(device),
        "gpus": _gpus() if cuda else [],
        "driver": _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) if cuda else None,
        "cuda": torch.version.cuda if cuda else None,
        "cudnn": str(cudnn) if cudnn is not None else None,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "numpy": _version("numpy"),
        "hypothesis": _version("hypothesis"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
    }
