"""Counts in the report's sentences take the noun's plural unless the count is 1."""

from flashcheck.words import counted


def test_one_is_singular_and_every_other_count_plural():
    assert counted(1, "fp16 case") == "1 fp16 case"
    assert counted(0, "distinct bug") == "0 distinct bugs"
    assert counted(2730, "judged case") == "2,730 judged cases"


def test_a_long_list_shows_its_first_items_and_counts_the_rest():
    from flashcheck.words import listed

    assert listed(["a", "b"]) == "a, b"
    assert listed([f"r{i}" for i in range(150)]) == "r0, r1, r2, r3, r4 and 145 more"
    assert listed([f"r{i}" for i in range(6)], limit=None) == "r0, r1, r2, r3, r4, r5"
    assert listed([]) == ""


def test_a_line_wraps_at_the_terminals_width_under_its_own_indent(monkeypatch):
    from flashcheck.words import terminal_width, wrapped

    line = "      regimes: " + ", ".join(f"random/none/layout{i} {i}" for i in range(30))
    monkeypatch.setenv("COLUMNS", "72")
    assert terminal_width() == 72
    lines = wrapped(line).splitlines()
    assert len(lines) > 1 and all(len(x) <= 72 for x in lines)
    assert lines[0].startswith("      regimes: ") and all(x.startswith(" " * 10) for x in lines[1:])
    assert " ".join(x.strip() for x in lines) == line.strip()  # nothing lost, nothing cut inside a word
    assert all(x.rstrip().endswith(",") for x in lines[:-1])  # an item stays whole, with its count
    counts = ("  exact properties (within 25% of the time, 5% of the time): cases judged: determinism 1, poison 0, "
              "guard_bands 0, layout 0, batch 1, neutral 0, bias_shift 0, descale 0, isolation 1, page_order 1")
    assert wrapped(counts, 100).splitlines()[-1].strip() == "page_order 1"
    assert wrapped("  short") == "  short"


def test_without_a_terminal_the_width_is_a_sane_default(monkeypatch):
    import os
    import shutil

    from flashcheck.words import DEFAULT_WIDTH, terminal_width

    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size(fallback))
    assert terminal_width() == DEFAULT_WIDTH >= 80  # what shutil falls back on when stdout is no terminal
    monkeypatch.setattr(shutil, "get_terminal_size", lambda fallback=(80, 24): os.terminal_size((5, 24)))
    assert terminal_width() >= 40  # a width no line fits in


def test_prose_wraps_between_any_words_under_the_indent_asked_for():
    from flashcheck.words import wrapped

    line = "torch:math    " + " ".join(["the reference implementation of attention"] * 6)
    lines = wrapped(line, 60, indent=14).splitlines()
    assert len(lines) > 2 and all(len(x) <= 60 for x in lines)
    assert all(x.startswith(" " * 14) and x[14] != " " for x in lines[1:])
