"""The README is a user's guide: short, with the reference in docs/, whose commands run like the README's, and
the counts it and the reference state (built-in kernels, the self-test's planted bugs and rows) are the code's,
so that neither can go stale."""

from __future__ import annotations

import re

import pytest

from ._markdown import ROOT, documents

GUIDE_LINES = 400


def _flat(name: str) -> str:
    """The page's text with every run of white space one space: a sentence may wrap anywhere."""
    return " ".join((ROOT / name).read_text(encoding="utf-8").split())


def test_the_readme_is_a_guide_of_at_most_400_lines():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= GUIDE_LINES, f"README.md has {lines} lines, more than {GUIDE_LINES}: move reference to docs/"


def test_every_page_of_docs_has_its_commands_run():
    assert [p for p in sorted((ROOT / "docs").glob("*.md")) if p not in documents()] == []


def _counts() -> dict:
    from flashcheck.kernels.planted import SELFTEST_BUILTINS
    from flashcheck.kernels.registry import BUILTIN_KERNELS
    from flashcheck.kernels.triton import planted
    from flashcheck.kernels.triton.planted_variants import VARIANT_MUTANTS
    from flashcheck.selftest.config import SelftestConfig
    from flashcheck.selftest.run import selftest_plan
    from flashcheck.selftest.subjects import subjects

    def bugs(device: str, backward: bool = False) -> int:
        return len(subjects(device, which="bugs", backward=backward))

    builtin_bugs = sum(len(b) for b in SELFTEST_BUILTINS.values())  # after flashcheck:triton's
    return {
        "kernels": len(BUILTIN_KERNELS),
        "planted": (bugs("cuda") - builtin_bugs, len(planted.MUTANTS), len(VARIANT_MUTANTS)),
        "built-in planted": (builtin_bugs,),
        "cpu rows": (len(selftest_plan(SelftestConfig("cpu", which="correct"))),
                     len(selftest_plan(SelftestConfig("cpu", which="bugs")))),
        "backward": (bugs("cuda", backward=True), bugs("cpu", backward=True)),
    }


# (page, what, the sentence with its numbers as groups)
STATED = [
    ("README.md", "kernels", r"one of the (\d+) built-in kernels"),
    ("README.md", "planted", r"(\d+) planted bugs in `flashcheck:triton` \((\d+) in the plain kernel, (\d+) in its "
                             r"attention variants\)"),
    ("README.md", "built-in planted", r"and (\d+) of the built-in references \(`torch:mla`"),
    ("README.md", "cpu rows", r"On the CPU that is (\d+) correct rows and (\d+) planted-bug rows"),
    ("README.md", "backward", r"(\d+) planted backward bugs \((\d+) on the CPU\)"),
    ("docs/cli.md", "planted", r"(\d+) planted-bug variants of `flashcheck:triton`, made by editing its source\. (\d+) "
                               r"are in the plain kernel .*? and (\d+) in its attention variants"),
    ("docs/cli.md", "cpu rows", r"has (\d+) correct rows of 200 cases .*? and (\d+) planted-bug rows"),
    ("docs/cli.md", "backward", r"(\d+) planted edits of the Triton backward \((\d+) on the CPU"),
]


@pytest.mark.parametrize("page, what, pattern", STATED, ids=[f"{p}: {w}" for p, w, _ in STATED])
def test_the_counts_a_page_states_are_the_codes(page, what, pattern):
    found = re.search(pattern, _flat(page))
    assert found, f"{page} no longer says /{pattern}/: keep the sentence, or this test, in step with the page"
    stated = tuple(int(n) for n in found.groups())
    code = _counts()[what]
    assert stated == (code if isinstance(code, tuple) else (code,)), f"{page}: {what} {stated}, the code's {code}"


def test_the_reference_names_every_built_in_kernel():
    from flashcheck.kernels.registry import BUILTIN_KERNELS

    text = _flat("docs/cli.md")
    assert [name for name in BUILTIN_KERNELS if f"`{name}`" not in text] == []
