"""An output in a folder that the user cannot enter or write (a non-root user's ``--json /root/x.json``) is a
usage error that names the option, echoes its value and says how to fix it, before anything runs: never a
PermissionError traceback with exit 1 (the status of a bug found). Root may write anywhere, so as root the
command runs as user nobody against a folder of root's with mode 0700; as another user, against a folder with
mode 000."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

AS_ROOT = os.geteuid() == 0
NOBODY = 65534
# flashcheck from this process's import path (its packages, the checkout), in any interpreter of this Python
# version: this environment's own interpreter may lie where nobody cannot go (pyenv's, under /root), the
# system's of the same version not. Each folder is a site folder, for the editable install's .pth file.
PATHS = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
BOOT = ("import os, site, sys; [site.addsitedir(p) for p in sys.argv.pop(1).split(os.pathsep)]; "
        "from flashcheck.cli import main; sys.exit(main(sys.argv[1:]))")

# command, the option, its value: one per output option of every command
CASES = [
    (["fuzz", "torch:math", "--device", "cpu", "--json", "{blocked}/summary.json"], "--json"),
    (["fuzz", "torch:math", "--device", "cpu", "--corpus", "{blocked}/corpus"], "--corpus"),
    (["selftest", "--device", "cpu", "--json", "{blocked}/rows.json"], "--json"),
    (["merge", "{inputs}/summary.json", "--json", "{blocked}/merged.json"], "--json"),
    (["signoff", "torch:math", "--device", "cpu", "--out", "{blocked}/signoff"], "--out"),
    (["replay", "{inputs}/case.json", "--device", "cpu", "--json", "{blocked}/verdict.json"], "--json"),
    (["repro", "{inputs}/case.json", "--device", "cpu", "--out", "{blocked}/repro"], "--out"),
    (["report", "{inputs}/report", "--out", "{blocked}/report"], "--out"),
]


def _flashcheck(python: str, argv: list, cwd) -> subprocess.CompletedProcess:
    user = dict(user=NOBODY, group=NOBODY, extra_groups=[]) if AS_ROOT else {}
    env = dict(os.environ, HOME=str(Path(cwd) / "home"))  # nobody's own (matplotlib keeps its settings there)
    return subprocess.run([python, "-I", "-S", "-c", BOOT, PATHS, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, **user)


@pytest.fixture(scope="module")
def inputs():
    """A folder anyone can read, with what the commands read before they check their output: a sign-off
    report, a saved case (empty files: the output is checked before the case is read)."""
    folder = Path(tempfile.mkdtemp(prefix="flashcheck-inputs-"))
    folder.chmod(0o755)
    (folder / "home").mkdir(mode=0o777)
    (folder / "home").chmod(0o777)
    (folder / "report").mkdir()
    (folder / "report" / "report.json").write_text('{"schema": "flashcheck-report", "schema_version": 1}')
    for name in ("case.json", "case.npz"):
        (folder / name).write_text("")
    yield folder
    shutil.rmtree(folder)


@pytest.fixture(scope="module")
def python(inputs) -> str:
    """An interpreter that runs flashcheck as the command's user (nobody, under root), else a skip that says why."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    tried = []
    for candidate in dict.fromkeys([os.path.realpath(sys.executable),
                                    shutil.which(version, path="/usr/local/bin:/usr/bin:/bin")]):
        if candidate is None:
            continue
        try:
            done = _flashcheck(candidate, ["--help"], inputs)
        except OSError as exc:
            tried.append(f"{candidate}: {exc}")
            continue
        if done.returncode == 0:
            return candidate
        tried.append(f"{candidate}: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}")
    who = "user nobody" if AS_ROOT else "this user"
    pytest.skip(f"{who} cannot run flashcheck from this environment and checkout ({'; '.join(tried)}): make "
                "them and an interpreter of this Python version readable by others to run this test")


@pytest.fixture
def blocked():
    """A folder that the command's user cannot enter: root's with mode 0700 (the command runs as nobody), or
    the user's own with mode 000."""
    folder = Path(tempfile.mkdtemp(prefix="flashcheck-blocked-"))
    folder.chmod(0o700 if AS_ROOT else 0)
    yield folder
    folder.chmod(0o700)
    shutil.rmtree(folder)


@pytest.mark.parametrize("argv, option", CASES, ids=[f"{a[0]} {o}" for a, o in CASES])
def test_an_output_in_a_folder_the_user_cannot_enter_is_a_usage_error(argv, option, python, inputs, blocked):
    argv = [a.format(inputs=inputs, blocked=blocked) for a in argv]
    value = argv[argv.index(option) + 1]
    done = _flashcheck(python, argv, inputs)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"{option}='{value}': cannot write in '{blocked}'" in done.stderr, done.stderr
    assert f"Pass a {option} path in a folder you can write to" in done.stderr, done.stderr
    blocked.chmod(0o700)  # its owner may look in again
    assert not os.listdir(blocked), "nothing was written"
