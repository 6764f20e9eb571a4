"""The documented installs' resolutions (tests/docs/test_setup_resolution.py), started when the test run starts.

Each resolution waits on the package index for about a minute and needs no core: started by the first process of
the run (pytest's, or pytest-xdist's controller, before its workers), they run while the other tests do, and the
test only reads what they wrote. A run that does not select the test starts none.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ._markdown import blocks, documents

FOLDER_VARIABLE = "FLASHCHECK_TEST_RESOLUTIONS"  # where the started resolutions write, for the workers to read
TEST_FILE = Path(__file__).with_name("test_setup_resolution.py")
PIP_INSTALL = re.compile(r"\bpip install ([^&|;]+)")


def installs() -> list[tuple[Path, str]]:
    """(folder it runs in, arguments) of every ``pip install`` in a command block, the test command's too."""
    found = []
    for path in documents():
        for block in blocks(path):
            if block.info in ("sh", "bash", "shell", "console") or block.exempt:
                found += [(path.parent, match[1].strip()) for match in PIP_INSTALL.finditer(block.text)]
    return found


def _index_only_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTEST_", "PYTHON", "VIRTUAL_ENV"))}
    env["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file at all
    return env


def start(folder: Path) -> None:
    """Start every resolution (``--dry-run``: nothing installed), each writing its report, output and exit status
    into ``folder``."""
    for i, (cwd, args) in enumerate(installs()):
        pip = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--no-cache-dir",
               "--use-feature=fast-deps", "--report", str(folder / f"report{i}.json"), *shlex.split(args)]
        # The exit status is written last, once the output is complete: its file says the resolution is done.
        script = f"{shlex.join(pip)} > {folder / f'output{i}.txt'} 2>&1; echo $? > {folder / f'status{i}'}"
        subprocess.Popen(["bash", "-c", script], cwd=cwd, env=_index_only_env(), start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def selected(config) -> bool:
    """Whether this run's paths and markers may select the test (a ``-k`` expression may still leave it out)."""
    if re.search(r"\bnot\s+slow\b", config.option.markexpr or ""):
        return False
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args] or [TEST_FILE.parents[1]]
    return any(path == TEST_FILE or path in TEST_FILE.parents for path in paths)


def start_for_the_run(config) -> None:
    """At the start of a run that may select the test: start the resolutions and tell the workers where."""
    if hasattr(config, "workerinput") or FOLDER_VARIABLE in os.environ or not selected(config):
        return
    folder = Path(tempfile.mkdtemp(prefix="flashcheck-resolutions-"))
    start(folder)
    os.environ[FOLDER_VARIABLE] = str(folder)


def clean_up(config) -> None:
    """At the end of the run that started them: remove what the resolutions wrote."""
    if not hasattr(config, "workerinput") and FOLDER_VARIABLE in os.environ:
        shutil.rmtree(os.environ.pop(FOLDER_VARIABLE), ignore_errors=True)


@dataclass(frozen=True)
class Resolution:
    folder: Path  # where the install runs
    args: str  # pip install's arguments
    status: int
    output: str
    report: Path


def results(timeout: float = 900) -> list[Resolution]:
    """Every resolution's result, waiting for those still running (started now where the run did not)."""
    if FOLDER_VARIABLE not in os.environ:
        os.environ[FOLDER_VARIABLE] = tempfile.mkdtemp(prefix="flashcheck-resolutions-")
        start(Path(os.environ[FOLDER_VARIABLE]))
    folder, deadline = Path(os.environ[FOLDER_VARIABLE]), time.monotonic() + timeout
    out = []
    for i, (cwd, args) in enumerate(installs()):
        status = folder / f"status{i}"
        while not status.is_file() or not status.read_text().strip():
            assert time.monotonic() < deadline, f"`pip install {args}` did not resolve within {timeout:.0f} s"
            time.sleep(0.5)
        out.append(Resolution(cwd, args, int(status.read_text()), (folder / f"output{i}.txt").read_text(),
                              folder / f"report{i}.json"))
    return out
