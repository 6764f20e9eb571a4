"""The commands of the project's Markdown files and what each is documented to do.

A command is a fenced code block marked ``sh``. The line before it says what it does:

    <!-- expect: exit 1 | BUG -->
    ```sh
    flashcheck fuzz ...
    ```

``exit N`` is the exit status; each ``| TEXT`` after it is text the output must contain. Words before ``exit``
say where it runs (see tests/docs/test_commands.py): ``clone`` (in a fresh clone, with a fresh virtual
environment), ``no-gpu`` (the outcome on a machine without a CUDA GPU), ``case`` (``....`` in the command
stands for the rest of a saved case's name). The one block between ``<!-- test-command -->`` and
``<!-- /test-command -->`` is the README's test command, which .ci/run runs. Every other fenced block says
what it holds (``python``, ``text``, ``toml``), and indented code blocks are refused: a command cannot be
hidden from the tests by its formatting.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND_INFOS = ("sh", "bash", "shell", "console")
OTHER_INFOS = ("python", "text", "toml", "json")
FLAGS = ("clone", "no-gpu", "case")
TEST_COMMAND = ("<!-- test-command -->", "<!-- /test-command -->")
_EXPECT = re.compile(r"^<!--\s*expect:(?P<body>.*?)-->\s*$")


def show(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def documents() -> list[Path]:
    """The Markdown files whose commands a user runs: the README, the reference in docs/ and every example's."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str
    text: str
    marker: str | None  # the line before the fence, if it is a comment
    exempt: bool = False  # the README's test command

    @property
    def where(self) -> str:
        return f"{show(self.path)}:{self.line}"


@dataclass
class Expect:
    exit: int
    output: list[str] = field(default_factory=list)
    flags: tuple[str, ...] = ()


@dataclass
class Command:
    block: Block
    expect: Expect

    @property
    def id(self) -> str:
        return self.block.where


def parse_expect(marker: str | None, where: str) -> Expect:
    match = _EXPECT.match(marker or "")
    if not match:
        raise ValueError(f"{where}: a command block needs `<!-- expect: exit N | TEXT -->` on the line before it "
                         f"(found {marker!r}), so that a test runs it and checks its outcome")
    head, *output = [part.strip() for part in match["body"].split("|")]
    words = head.replace(",", " ").split()
    if len(words) < 2 or words[-2] != "exit" or not words[-1].isdigit():
        raise ValueError(f"{where}: the expect marker {marker!r} must end its first part with `exit N`")
    flags = tuple(words[:-2])
    unknown = [flag for flag in flags if flag not in FLAGS]
    if unknown:
        raise ValueError(f"{where}: unknown word(s) {unknown} in {marker!r}; known: {', '.join(FLAGS)}")
    return Expect(int(words[-1]), [text for text in output if text], flags)


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``; raises on an indented code block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, start, last_text = [], None, ""  # last_text: the last non-blank line outside a fence
    for number, line in enumerate(lines, 1):
        if line.startswith("```"):
            if start is None:
                start, info, marker = number, line[3:].strip(), last_text
            else:
                exempt = marker == TEST_COMMAND[0] and lines[number:number + 1] == [TEST_COMMAND[1]]
                found.append(Block(path, start, info, "\n".join(lines[start:number - 1]), marker, exempt))
                start, last_text = None, line
            continue
        if start is None and line.startswith("    ") and number > 1 and not lines[number - 2].strip():
            raise ValueError(f"{show(path)}:{number}: an indented code block ({line.strip()!r}); "
                             "use a fenced block: ```sh with an expect marker for a command, ```text otherwise")
        if start is None and line.strip():
            last_text = line.strip()
    return found


def commands(path: Path) -> list[Command]:
    """The marked command blocks of ``path``; raises on a block that is neither marked nor declared."""
    result = []
    for block in blocks(path):
        if block.info in OTHER_INFOS or block.exempt:
            continue
        if block.info not in COMMAND_INFOS:
            raise ValueError(f"{block.where}: a fenced block without a known language ({block.info!r}); "
                             f"mark a command ```sh (with an expect marker), anything else one of {OTHER_INFOS}")
        result.append(Command(block, parse_expect(block.marker, block.where)))
    return result
