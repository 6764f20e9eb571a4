"""The lse convention a spec declares (natural log or log2; an empty row's lse -inf, +inf or any) is the one
its kernel is held to, and an lse in the other base is named as such (vLLM PR 52796's bug)."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase


def _attention(q, k, v, *, scale, causal="none", attn_mask=None, base="e", empty=-math.inf):
    """Correct attention in float64 with its lse in ``base``; rows without keys give 0 and lse ``empty``."""
    s = (q.double() @ k.double().transpose(-1, -2)) * scale
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.nan_to_num(torch.exp(s - lse[..., None]))
    lse = torch.where(lse == -math.inf, empty, lse / (math.log(2) if base == "2" else 1.0))
    return (p @ v.double()).to(q.dtype), lse.float()


def _kernel(returns: str, *, declared: str, empty=-math.inf, empty_lse=None):
    def attention(q, k, v, *, scale, causal="none", attn_mask=None):
        return _attention(q, k, v, scale=scale, attn_mask=attn_mask, base=returns, empty=empty)

    return flashcheck.kernel(attention, dtypes=("fp32",), attn_mask=True, fully_masked_rows="zero", lse_base=declared,
                             empty_lse=empty_lse)


def _case(masked_row: bool = False) -> AttentionCase:
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 16, generator=gen) for _ in range(3))
    mask = torch.ones(1, 1, 7, 7, dtype=torch.bool)
    if masked_row:
        mask[..., 3, :] = False
    return AttentionCase.create(q, k, v, scale=0.25, attn_mask=mask)


@pytest.mark.parametrize("base", ["e", "2"])
def test_an_lse_in_the_declared_base_passes(base):
    verdict = flashcheck.check(_kernel(base, declared=base), _case(masked_row=True), device="cpu", properties=())
    assert verdict.ok, str(verdict)


@pytest.mark.parametrize("declared,returns,named", [("e", "2", "log2"), ("2", "e", "natural log")])
def test_an_lse_in_the_other_base_is_a_bug_that_names_the_base_it_matches(declared, returns, named):
    verdict = flashcheck.check(_kernel(returns, declared=declared), _case(), device="cpu", properties=())
    assert [f.kind for f in verdict.findings] == ["lse"], str(verdict)
    assert f"matches an lse in {named}" in verdict.findings[0].diagnosis


def test_an_empty_row_holds_the_declared_lse():
    case = _case(masked_row=True)
    assert flashcheck.check(_kernel("e", declared="e", empty=math.inf, empty_lse="+inf"), case, device="cpu",
                            properties=()).ok
    wrong = flashcheck.check(_kernel("e", declared="e", empty=-math.inf, empty_lse="+inf"), case, device="cpu",
                             properties=())
    assert [f.kind for f in wrong.findings] == ["masked_row_promise"], str(wrong)
    assert "lse +inf" in wrong.findings[0].diagnosis
    finite = flashcheck.check(_kernel("e", declared="e", empty=0.0), case, device="cpu", properties=())
    assert [f.kind for f in finite.findings] == ["masked_row_promise"], str(finite)  # FlashInfer 4452's bug
    anything = flashcheck.check(_kernel("e", declared="e", empty=0.0, empty_lse="any"), case, device="cpu",
                                properties=())
    assert anything.ok, str(anything)


def test_an_unknown_convention_is_refused_by_name():
    with pytest.raises(flashcheck.InvalidArgument, match="lse_base"):
        flashcheck.KernelSpec(lse_base="10")
    with pytest.raises(flashcheck.InvalidArgument, match="empty_lse"):
        flashcheck.KernelSpec(empty_lse="nan")
