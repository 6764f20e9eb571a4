"""Every command of README.md, docs/ and examples/ runs, and does what the text next to it says.

The commands and their outcomes come from the Markdown itself (tests/docs/_markdown.py), so a command
cannot drift from its documented outcome, and a new command without an ``<!-- expect: ... -->`` marker
fails ``test_every_command_block_is_marked``.

- A plain command runs here, with this environment's ``flashcheck`` on PATH, in an empty folder.
- A ``clone`` command installs: it runs for real in a fresh ``git clone`` of this repository (HEAD: the
  committed files, as CI sees them), with none of this environment's Python on PATH. The commands of one
  file run in order, in the folder of that file in the clone; once a command has made ``.venv`` there, the
  next ones run with it activated, as in the shell the user typed them into. These tests are ``slow``
  (minutes: PyTorch is installed into a new virtual environment), and CI runs them.
- The README's test command (between its test-command markers) is exempt: it runs this test suite, so a
  test cannot run it. .ci/run runs it (test_ci_runs_the_readme_test_command checks that it is the same).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from ._markdown import ROOT, TEST_COMMAND, Command, blocks, commands, documents

BIN = str(Path(sys.executable).parent)
PLACEHOLDER = re.compile(r"\S*\.\.\.\.\S*")
# The example's kernel with a planted bug (a 1% scale error), to make the failing case its replay needs.
KERNEL_FILE = Path("src/tinyflash/attention.py")
PLANT = ("scale / math.log(2.0)", "scale * 1.01 / math.log(2.0)")


def _all_commands() -> list[Command]:
    try:
        return [command for path in documents() for command in commands(path)]
    except ValueError:
        return []  # test_every_command_block_is_marked says why


def _param(command: Command):
    return pytest.param(command, id=command.id)


PLAIN = [_param(c) for c in _all_commands() if "clone" not in c.expect.flags]
CLONED = sorted({c.block.path for c in _all_commands() if "clone" in c.expect.flags})


def _env(*, keep_venv: bool) -> dict:
    """This process's environment without what pytest and this test suite set; without this virtual
    environment too when ``keep_venv`` is false."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "PYTHON")) and k not in ("TRITON_INTERPRET", "VIRTUAL_ENV")}
    paths = [p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if p != BIN]
    env["PATH"] = os.pathsep.join(([BIN] if keep_venv else []) + paths)
    return env


def _run(text: str, cwd: Path, env: dict, timeout: float) -> tuple[int, str]:
    result = subprocess.run(["bash", "-c", text], cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    return result.returncode, result.stdout + result.stderr


def _fill_case(text: str, cwd: Path) -> str:
    """``....`` in a ``case`` command stands for the rest of a saved case's name: take the newest match."""
    pattern = PLACEHOLDER.search(text)[0]
    matches = sorted(cwd.glob(pattern.replace("....", "*")), key=lambda p: p.stat().st_mtime)
    assert matches, f"no saved case in {cwd} matches {pattern}"
    return text.replace(pattern, str(matches[-1].relative_to(cwd)))


def _check(command: Command, cwd: Path, env: dict, timeout: float = 600) -> str:
    expect = command.expect
    if "no-gpu" in expect.flags and torch.cuda.is_available():
        return "skipped: its documented outcome is the one without a GPU"
    text = _fill_case(command.block.text, cwd) if "case" in expect.flags else command.block.text
    if "clone" in expect.flags and (cwd / ".venv").is_dir():
        text = f". .venv/bin/activate && {text}"
    started = time.monotonic()
    code, output = _run(text, cwd, env, timeout)
    print(f"{command.id}: exit {code} in {time.monotonic() - started:.0f} s")  # shown with -s or on failure
    where = f"{command.id}: `{text}`"
    assert code == expect.exit, f"{where} exited {code}, documented {expect.exit}:\n{output[-6000:]}"
    for wanted in expect.output:
        assert wanted in output, f"{where}: no {wanted!r} in its output:\n{output[-6000:]}"
    return output


def test_every_command_block_is_marked():
    for path in documents():
        found = commands(path)  # raises, naming the line, on an unmarked or undeclared block
        assert found or path.name != "README.md" or path.parent != ROOT, "README.md lists no command"


def test_ci_runs_the_readme_test_command():
    exempt = [block for block in blocks(ROOT / "README.md") if block.exempt]
    assert len(exempt) == 1, f"README.md needs exactly one block between {TEST_COMMAND}, found {len(exempt)}"
    extracted = subprocess.run(["bash", "-c", "sed -n '/<!-- test-command -->/,/<!-- \\/test-command -->/p' "
                                "README.md | sed -n '/^```/,/^```/p' | sed '1d;$d'"],
                               cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    assert extracted == exempt[0].text.strip()
    assert "README.md" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("command", PLAIN)
def test_documented_command(command, tmp_path):
    _check(command, tmp_path, _env(keep_venv=True), timeout=900)


def _plant_bug_and_fail(cwd: Path, env: dict) -> None:
    """Make the failing case a ``case`` command replays: the example's kernel off by 1% fails its tests."""
    source = cwd / KERNEL_FILE
    text = source.read_text()
    assert PLANT[0] in text, f"{source} no longer has {PLANT[0]!r} to plant the bug in"
    source.write_text(text.replace(PLANT[0], PLANT[1]))
    code, output = _run(". .venv/bin/activate && pytest --flashcheck-device cpu -x", cwd, env, 900)
    assert code == 1 and "flashcheck replay .flashcheck/corpus/" in output, output[-6000:]


@pytest.mark.slow
@pytest.mark.parametrize("document", CLONED, ids=[str(p.relative_to(ROOT)) for p in CLONED])
def test_documented_commands_in_a_fresh_clone(document, tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=300)
    cwd = clone / document.parent.relative_to(ROOT)
    # pip byte-compiles every module it installs (torch's 5,000: half of a fresh install's time); Python
    # compiles the modules a command imports when it first imports them, so nothing a command does changes.
    env = {**_env(keep_venv=False), "PIP_COMPILE": "0"}
    for command in commands(document):
        if "case" in command.expect.flags and "clone" in command.expect.flags:
            _plant_bug_and_fail(cwd, env)
        if "clone" in command.expect.flags:
            _check(command, cwd, env)
    shutil.rmtree(clone / ".venv", ignore_errors=True)
