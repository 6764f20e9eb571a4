"""docs/design.md's numbered sections run 1, 2, 3, ... with "Known limits" last, and every "section N" that
the repository cites of it names a section that is there: a section appended or moved must not leave two
sections 7 or a citation pointing at the wrong text."""

from __future__ import annotations

import re

from ._markdown import ROOT
from .test_links import _tracked_text_files

DESIGN = ROOT / "docs" / "design.md"
HEADING = re.compile(r"^## (\d+)\. (.+)$", re.M)
LAST = "Known limits and thin spots"
# "section 3" inside design.md, or "docs/design.md, section 3" / "design.md section 3" anywhere.
CITATION = re.compile(r"design\.md,? (?:section|§) ?(\d+)", re.I)
OWN_CITATION = re.compile(r"\((?:see )?(?:section|§) ?(\d+)\)", re.I)
TITLE_CITATION = re.compile(r'design\.md, "([^"]+)"')  # a section cited by its title


def sections(text: str) -> list[tuple[int, str]]:
    return [(int(number), title.strip()) for number, title in HEADING.findall(text)]


def numbering_errors(text: str) -> list[str]:
    found = sections(text)
    errors = [f"section {number} ({title}) where {expected} belongs"
              for expected, (number, title) in enumerate(found, 1) if number != expected]
    if found and found[-1][1] != LAST:
        errors.append(f"the last section is {found[-1][1]!r}, not {LAST!r}: add new sections before it")
    return errors


def test_design_sections_are_numbered_in_order_with_known_limits_last():
    assert numbering_errors(DESIGN.read_text(encoding="utf-8")) == []


def test_the_numbering_check_sees_a_repeat_a_gap_and_a_section_after_the_limits():
    assert numbering_errors(f"## 1. A\n\n## 2. B\n\n## 2. C\n\n## 4. {LAST}\n") == ["section 2 (C) where 3 belongs"]
    assert numbering_errors(f"## 1. A\n\n## 3. {LAST}\n") == [f"section 3 ({LAST}) where 2 belongs"]
    assert numbering_errors(f"## 1. {LAST}\n\n## 2. After\n") == \
        [f"the last section is 'After', not {LAST!r}: add new sections before it"]


def _cited(pattern: re.Pattern) -> list[tuple[str, str]]:
    """Each match of ``pattern`` in the repository's tracked text files, with the file it is in."""
    return [(str(path.relative_to(ROOT)), found) for path in _tracked_text_files() if path.exists()
            for found in pattern.findall(path.read_text(encoding="utf-8", errors="replace"))]


def test_every_citation_of_a_design_section_names_one_that_exists():
    text = DESIGN.read_text(encoding="utf-8")
    numbers = {number for number, _ in sections(text)}
    cited = _cited(CITATION) + [("docs/design.md", n) for n in OWN_CITATION.findall(text)]
    assert ("docs/design.md", "3") in cited, "the citation patterns no longer find design.md's own (section 3)"
    assert [f"{where}: section {n}" for where, n in cited if int(n) not in numbers] == []


def test_every_citation_of_a_design_section_by_title_names_one_that_exists():
    titles = {title for _, title in sections(DESIGN.read_text(encoding="utf-8"))}
    assert [f"{where}: {title!r}" for where, title in _cited(TITLE_CITATION) if title not in titles] == []
