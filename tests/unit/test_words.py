"""Counts in the report's sentences take the noun's plural unless the count is 1."""

from flashcheck.words import counted


def test_one_is_singular_and_every_other_count_plural():
    assert counted(1, "fp16 case") == "1 fp16 case"
    assert counted(0, "distinct bug") == "0 distinct bugs"
    assert counted(2730, "judged case") == "2,730 judged cases"
