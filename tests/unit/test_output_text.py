"""What flashcheck prints and names for people: saved cases' file names, a verdict's headline."""

from __future__ import annotations

import math
import re

import pytest

from flashcheck.campaign.corpus import _slug
from flashcheck.judge.verdict import BUG, Finding, Verdict

LONG = "flashcheck:triton~acc_rescale_forgotten[block_m=32,block_n=32,num_warps=4,num_stages=2,input_precision=ieee]"


@pytest.mark.parametrize("name", [LONG, "flashcheck:triton[block_m=32,block_n=32]", "mylib:decode", "x" * 80])
def test_saved_case_names_cut_between_words(name):
    slug = _slug(name)
    assert len(slug) <= 60 and re.fullmatch(r"[\w.-]+", slug)
    words = set(re.split(r"[^\w.]+", name))
    kept = slug.split("-")
    if len(re.sub(r"[^\w.]+", "-", name).strip("-")) > 60:
        kept = kept[:-1]  # a cut name ends with a hash of the whole name
    assert all(word in words for word in kept), f"{slug!r} cuts a word of {name!r}"


def test_cut_names_of_different_kernels_differ():
    other = LONG.replace("ieee", "tf32x3")
    assert _slug(LONG) != _slug(other)
    assert "block_n-3-" not in _slug(LONG) and _slug(LONG).count("-") >= 5


def test_an_lse_only_finding_shows_its_ratio_and_no_empty_breakdown():
    lse = Finding("lse", BUG, "lse off on 1 of 1 rows", index=(0, 0, 0), error=1e-3, ratio=905.0,
                  budget={"total": 1.105e-6})
    text = str(Verdict.from_findings([lse], max_ratio=0.0, kernel="k", case="c"))
    assert "max error/budget 0 (out), 905 (lse)" in text
    assert re.search(r"budget 1\.105e-06$", text, flags=re.M) and "= \n" not in text + "\n", text


def test_a_headline_without_lse_is_the_outputs_ratio():
    verdict = Verdict.from_findings([], max_ratio=0.42, kernel="k", case="c")
    assert str(verdict).splitlines()[1] == "  max error/budget 0.42"
    assert math.isnan(Verdict.from_findings([], max_ratio=math.nan).max_ratio)
