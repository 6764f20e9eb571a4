"""Every finding kind, and so every exact property's failure, has a named cause with a title: none falls through
to a nameless one."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.campaign.causes import root_cause
from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.properties import PROPERTY_FINDINGS
from flashcheck.judge.serving import SERVING_PROPERTY_FINDINGS
from flashcheck.judge.verdict import BUG, FINDING_KINDS, SUSPICIOUS, Finding, Verdict

ALL_PROPERTIES = {**PROPERTY_FINDINGS, **SERVING_PROPERTY_FINDINGS}


def _cause(kind: str, **details):
    status = SUSPICIOUS if kind == "reordering_outlier" else BUG
    return root_cause(Verdict.from_findings([Finding(kind, status, "what went wrong", details=details)],
                                            max_ratio=math.nan))


@pytest.mark.parametrize("kind", FINDING_KINDS)
def test_every_finding_kind_has_a_named_cause(kind):
    cause = _cause(kind)
    assert cause.key not in ("bug", "suspicious") and not cause.key.startswith("finding:"), cause
    assert cause.title and "no finding" not in cause.title, cause


def test_every_exact_property_fails_with_a_known_finding_kind():
    assert set(PROPERTY_FINDINGS) == set(flashcheck.judge.properties.PROPERTIES)
    assert set(SERVING_PROPERTY_FINDINGS) == set(flashcheck.judge.serving.SERVING_PROPERTIES)
    unknown = {name: kind for name, kind in ALL_PROPERTIES.items() if kind not in FINDING_KINDS}
    assert not unknown, f"add these finding kinds to FINDING_KINDS, each with its cause: {unknown}"


def test_a_finding_of_an_unknown_kind_is_refused_where_it_is_made():
    with pytest.raises(ValueError, match="not_a_kind"):
        Finding("not_a_kind", BUG, "a new property's finding")


def test_the_page_order_property_is_not_taken_for_the_dense_layout_property():
    assert _cause("layout_dependence").key == "layout:page_order"
    assert _cause("layout_dependence", layout="strided").key == "layout"


@flashcheck.kernel(dtypes=("fp32",), softcap=True, precision="upcast")
def _capped(q, k, v, *, scale, causal, attn_mask=None, softcap=None):
    """c tanh(s / c) as written: at the neutral cap c = inf it is inf x 0 = NaN."""
    s = (q @ k.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    return torch.softmax(s, -1) @ v


def test_an_infinite_soft_cap_that_gives_nan_is_a_named_bug():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16, generator=gen) for _ in range(3))
    verdict = flashcheck.check(_capped, AttentionCase.create(q, k, v, scale=0.25), device="cpu",
                               properties=("neutral",))
    assert [f.kind for f in verdict.findings] == ["neutral_variant"], str(verdict)
    cause = root_cause(verdict)
    assert cause.key == "variant:neutral" and "neutral value" in cause.title, cause
