"""The field's rules on one kernel output, as sign-offs record them: the case's variant in their references,
"fail" without an output, "n/a" where a rule is undefined, and no crash on fully masked rows."""

from __future__ import annotations

import torch

from flashcheck import Variant
from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.anchors import anchor_outcomes
from flashcheck.judge.backward import check_backward, upstream_gradient
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.oracle import reference_attention


def _case(dtype=torch.float16, variant=None, attn_mask=None, causal="none"):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 24, 16, generator=g).to(dtype) for _ in range(3))
    return AttentionCase.create(q, k, v, scale=0.25 * 4, causal=causal, attn_mask=attn_mask, variant=variant)


def _exact(case, variant=None) -> torch.Tensor:
    """The exact output rounded to the case's dtype, 0 on rows with no visible key: what a perfect kernel
    returns (the oracle leaves those rows undefined)."""
    mask = case.attn_mask
    ref = reference_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal, attn_mask=mask,
                              variant=case.variant if variant is None else variant)
    return torch.as_tensor(ref.out).nan_to_num(0.0).to(case.q.dtype)


CAPPED = Variant(softcap=2.0, sinks=torch.tensor([1.0, -0.5]), attn_bias=torch.randn(1, 2, 24, 24))


def test_a_perfect_output_of_a_variant_case_passes_every_rule():
    case = _case(variant=CAPPED)
    assert anchor_outcomes(case, (_exact(case), None), device="cpu") == {"flash-attention": "pass",
                                                                         "triton-tutorial": "pass"}


def test_the_rules_judge_the_variant_s_function_not_plain_attention():
    case = _case(variant=CAPPED)
    plain = _exact(case, variant=Variant())  # the right answer to another question
    assert anchor_outcomes(case, (plain, None), device="cpu") == {"flash-attention": "fail", "triton-tutorial": "fail"}


def test_no_output_fails_and_fp32_is_outside_flash_attention_s_rule():
    case = _case()
    assert set(anchor_outcomes(case, None, device="cpu").values()) == {"fail"}
    wrong_shape = (torch.zeros(1, 2, 24, 8, dtype=torch.float16), None)
    assert set(anchor_outcomes(case, wrong_shape, device="cpu").values()) == {"fail"}
    fp32 = _case(torch.float32)
    assert anchor_outcomes(fp32, (_exact(fp32), None), device="cpu") == {"flash-attention": "n/a",
                                                                         "triton-tutorial": "pass"}


def test_fully_masked_rows_and_the_backward_rules_do_not_crash():
    mask = torch.ones(24, 24, dtype=torch.bool)
    mask[3] = False  # row 3 sees no key
    case = _case(attn_mask=mask, causal="top_left")
    assert set(anchor_outcomes(case, (_exact(case), None), device="cpu").values()) == {"pass"}
    do = upstream_gradient(case, "cpu")
    right = check_backward(resolve_kernel("torch:math", device="cpu"), case, do=do, device="cpu")
    assert right.status == "PASS" and anchor_outcomes(case, right.output, device="cpu", do=do) == dict.fromkeys(
        ("flash-attention", "pytorch-sdpa", "triton-tutorial"), "pass")
    zeros = tuple(torch.zeros_like(t) for t in (case.q, case.k, case.v))  # no gradient at all
    said = anchor_outcomes(case, zeros, device="cpu", do=do)
    assert said["flash-attention"] == said["triton-tutorial"] == "fail", said
