"""SageAttention 1.0.6 (sage:sageattn) under the Triton interpreter, judged against its own quantizer's values:
where its key tiles are whole it is within the budget, and its three defects stay visible, each against a control
input that passes: the keys a partial last tile pads are not masked (non-causal, Nk not a multiple of 64), its K
smoothing writes into the caller's k, and that in-place write raises on a k whose elements share memory.
Skipped where sageattention is not installed (pip install sageattention==1.0.6)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase

pytestmark = pytest.mark.skipif(importlib.util.find_spec("sageattention") is None,
                                reason="sageattention is not installed")


def _case(n, d=64, dtype=torch.float16, causal="none", heads=(2, 2), seed=0, layout="contiguous"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads[0], n, d, generator=gen).to(dtype)
    k = (torch.randn(1, heads[1], n, d, generator=gen) + 2.0).to(dtype)  # a mean the smoothing takes out
    v = torch.randn(1, heads[1], n, d, generator=gen).to(dtype)
    if layout == "expanded":  # one K/V head viewed as all of them: the heads must be equal
        k, v = (t[:, :1].expand(t.shape).contiguous() for t in (k, v))
    return AttentionCase.create(q, k, v, scale=d ** -0.5, causal=causal, layout=layout)


def _kinds(verdict) -> set:
    return {f.kind for f in verdict.findings}


@pytest.mark.parametrize(("n", "d", "dtype", "causal", "heads"), [
    (64, 64, torch.float16, "none", (2, 2)), (128, 128, torch.float32, "top_left", (4, 2)),
    (192, 96, torch.float16, "top_left", (2, 1)), (100, 64, torch.float16, "top_left", (2, 2))])
def test_within_the_budget_of_its_quantizer_where_no_key_is_padded(n, d, dtype, causal, heads):
    verdict = flashcheck.check("sage:sageattn", _case(n, d, dtype, causal, heads), device="cpu", properties=())
    assert _kinds(verdict) == {"input_written"} and verdict.max_ratio < 1, str(verdict)


@pytest.mark.parametrize("n", [1, 70, 100])
def test_the_keys_a_partial_last_tile_pads_take_weight_without_a_causal_mask(n):
    verdict = flashcheck.check("sage:sageattn", _case(n), device="cpu", properties=())
    assert "over_budget" in _kinds(verdict), str(verdict)
    # control: the same keys under the causal mask, whose diagonal tile masks the padded columns
    control = flashcheck.check("sage:sageattn", _case(n, causal="top_left"), device="cpu", properties=())
    assert "over_budget" not in _kinds(control), str(control)


def test_its_smoothing_writes_into_the_callers_k_and_raises_where_k_is_a_broadcast_view():
    written = flashcheck.check("sage:sageattn", _case(64), device="cpu", properties=())
    assert [f.diagnosis.split(":")[0] for f in written.findings] == ["the kernel wrote into its input k"], str(written)
    expanded = flashcheck.check("sage:sageattn", _case(64, layout="expanded"), device="cpu", properties=())
    assert _kinds(expanded) == {"crash"} and "more than one element" in expanded.findings[0].diagnosis, str(expanded)


CASES = Path(__file__).parent / "sage_cases"  # shrunk by a CPU campaign (reports/sage-2026-12-07)


def _saved(stem: str) -> AttentionCase:
    return AttentionCase.load(CASES / f"sage-sageattn-{stem}.json")


def _scaled(case: AttentionCase, **fields) -> AttentionCase:
    return AttentionCase.create(fields.get("q", case.q), case.k, fields.get("v", case.v),
                                scale=fields.get("scale", case.scale), causal=case.causal)


def test_its_fp16_p_v_accumulator_overflows_where_a_tiles_sum_passes_65504():
    case = _saved("input_written+nonfinite-shrunk-ada91bc3f3")  # v up to 1,496 on 45 keys of one tile: 67,320
    verdict = flashcheck.check("sage:sageattn", case, device="cpu", properties=())
    assert "nonfinite" in _kinds(verdict) and "over_budget" not in _kinds(verdict), str(verdict)
    control = flashcheck.check("sage:sageattn", _scaled(case, v=case.v / 2), device="cpu", properties=())
    assert _kinds(control) == {"input_written"}, str(control)


def test_its_causal_mask_of_minus_1e6_lets_a_key_in_past_logits_of_a_million():
    case = _saved("input_written+over_budget-shrunk-74b02ef933")  # scale 8, |q|, |k| up to 1,230
    verdict = flashcheck.check("sage:sageattn", case, device="cpu", properties=())
    assert "over_budget" in _kinds(verdict), str(verdict)
    control = flashcheck.check("sage:sageattn", _scaled(case, scale=1e-3), device="cpu", properties=())
    assert _kinds(control) == {"input_written"}, str(control)


def test_the_shrunk_padding_case_has_one_key_and_63_padded():
    case = _saved("input_written+over_budget-shrunk-93901eb8b3")
    verdict = flashcheck.check("sage:sageattn", case, device="cpu", properties=())
    assert "over_budget" in _kinds(verdict) and verdict.max_ratio > 100, str(verdict)
    out = verdict.output[0].double()
    assert torch.allclose(out, case.v.double() / 64, rtol=1e-2)  # the key's value over 64 keys of score 0
