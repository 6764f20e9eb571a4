"""Every relative link of README.md, docs/, examples/ and reports/**/*.md leads to a file or folder that exists, and a
link to a heading of a Markdown file (``file.md#heading``, or ``#heading`` in the same file) to a heading
that is there: moving text between the README and reports/ must not leave a reader at a dead end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ._markdown import ROOT, documents, show

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _markdown_files() -> list[Path]:
    return list(dict.fromkeys([*documents(), *sorted((ROOT / "reports").rglob("*.md"))]))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {_slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def _broken(path: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (path.parent / file).resolve() if file else path
        if not resolved.exists():
            broken.append(f"{target}: no {show(resolved)}")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target}: no heading #{anchor} in {show(resolved)}")
    return broken


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert _broken(path) == []


def test_the_link_check_sees_a_dead_link(tmp_path):
    (tmp_path / "other.md").write_text("## A `code` heading, with punctuation!\n")
    page = tmp_path / "page.md"
    page.write_text("# Top\n[a](nowhere.md) [b](#no-such-heading) [c](#top) [d](other.md#a-code-heading-with-punctuation)"
                    " [e](other.md#gone) [f](https://example.com/x)\n```text\n[g](in-a-fence.md)\n```\n")
    assert _broken(page) == [f"nowhere.md: no {tmp_path / 'nowhere.md'}",
                             f"#no-such-heading: no heading #no-such-heading in {page}",
                             f"other.md#gone: no heading #gone in {tmp_path / 'other.md'}"]


# A document named in a source file, a test or a page, as ``name.md`` with an upper-case or path-like name
# (``DESIGN.md``, ``docs/design.md``): it must be one the repository holds.
CITED = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[A-Za-z][\w-]*\.md)\b")


def cited_documents(text: str) -> set[str]:
    return {m for m in CITED.findall(text) if "/" in m or m.split(".")[0].isupper()}


def _tracked_text_files() -> list[Path]:
    import subprocess

    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    files = [ROOT / f for f in listed if f.endswith((".py", ".md", ".toml", ".ini", ".sh", ".cfg"))]
    return files or [p for p in ROOT.rglob("*.py") if ".venv" not in p.parts]


def _holds(name: str, where: Path) -> bool:
    return any(candidate.exists() for candidate in (ROOT / name, where.parent / name)) or \
        any(ROOT.glob(f"**/{name}"))


def test_no_file_cites_a_document_the_repository_lacks():
    here = Path(__file__).resolve()  # this file names missing documents on purpose, below
    missing = sorted({f"{show(path)}: {name}" for path in _tracked_text_files() if path.exists() and path != here
                      for name in cited_documents(path.read_text(encoding="utf-8", errors="replace"))
                      if not _holds(name, path)})
    assert missing == []


def test_the_citation_check_sees_a_missing_document():
    assert cited_documents("see DESIGN.md and docs/design.md; README.md; notes.md") == \
        {"DESIGN.md", "docs/design.md", "README.md"}
    assert not _holds("NOWHERE-ELSE.md", ROOT / "README.md")
