"""Every ``pip install`` of the README and the examples resolves from the package index alone.

A machine's own pip configuration (a local wheel folder, extra indexes, constraints) can hide what a user
elsewhere gets from PyPI: torch 2.13.0 there is a CUDA build that pins one triton release, and an extra that
asks for another makes the set-up fail with ResolutionImpossible. So each install is resolved (``--dry-run``,
nothing installed) with every pip configuration ignored: no configuration file, no ``PIP_*`` variable.
``fast-deps`` reads each wheel's metadata with HTTP range requests instead of downloading it (torch's wheel is
500 MB), so the resolution takes about a minute. It needs the index: without a network it fails, as the
install itself would.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ._markdown import ROOT, blocks, documents, show

PIP_INSTALL = re.compile(r"\bpip install ([^&|;]+)")


def _installs() -> list[tuple[Path, str]]:
    """(folder it runs in, arguments) of every ``pip install`` in a command block, the test command's too."""
    found = []
    for path in documents():
        for block in blocks(path):
            if block.info in ("sh", "bash", "shell", "console") or block.exempt:
                found += [(path.parent, match[1].strip()) for match in PIP_INSTALL.finditer(block.text)]
    return found


INSTALLS = _installs()


def test_the_readme_installs_torch_and_the_interpreter():
    readme = [args for folder, args in INSTALLS if folder == ROOT]
    assert any("torch==" in args and "[cpu" in args for args in readme), readme


def _index_only_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTEST_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    return env


def _resolve(folder: Path, args: str, report: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
               "--use-feature=fast-deps", "--report", str(report), *shlex.split(args)]
    return subprocess.Popen(command, cwd=folder, env=_index_only_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_every_install_resolves_from_the_package_index_alone(tmp_path):
    # All at once: each waits on the network, not on this machine's cores.
    runs = [(folder, args, tmp_path / f"report{i}.json") for i, (folder, args) in enumerate(INSTALLS)]
    started = [(folder, args, report, _resolve(folder, args, report)) for folder, args, report in runs]
    for folder, args, report, process in started:
        output = process.communicate(timeout=900)[0]
        assert process.returncode == 0, f"`pip install {args}` in {show(folder)} does not resolve from the index " \
                                        f"alone:\n{output[-3000:]}"
        chosen = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                  for item in json.loads(report.read_text())["install"]}
        if "torch" in chosen and "triton" in chosen:
            # The triton the index's torch pins (torch 2.13.0: triton 3.7.1) must be one the interpreter runs
            # under (tests/interpreter passes with 3.7.1 and 3.9.0).
            major, minor = (int(part) for part in chosen["triton"].split(".")[:2])
            assert (major, minor) >= (3, 7), (args, chosen)
