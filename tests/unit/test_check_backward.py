"""check_backward: a kernel's dQ, dK, dV through autograd, judged against the oracle and the budget."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, check_backward
from flashcheck.errors import InvalidArgument

from ..budget._backward import fa2_backward


def _case(*, hq=4, hkv=2, nq=13, nk=17, d=16, dtype=torch.float16, masked_row=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, hq, nq, d, generator=gen).to(dtype)
    k = torch.randn(1, hkv, nk, d, generator=gen).to(dtype)
    v = torch.randn(1, hkv, nk, d, generator=gen).to(dtype)
    mask = None
    if masked_row:
        mask = torch.rand(1, hq, nq, nk, generator=gen) > 0.2
        mask[0, 1, 5] = False  # query 5 of head 1 sees no key
    return AttentionCase.create(q, k, v, scale=d ** -0.5, causal="bottom_right", attn_mask=mask)


def _fa2_kernel(bug=None, *, noisy=False, deterministic=True, fails=False):
    """A differentiable kernel: an exact forward, and the FA2-style backward of tests/budget/_backward.py."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale, causal, mask):
            ctx.save_for_backward(q, k, v)
            ctx.args = (scale, causal, mask)
            ref = flashcheck.reference_attention(q, k, v, scale=scale, causal=causal, attn_mask=mask)
            return torch.nan_to_num(ref.out, nan=0.0).to(q.dtype)

        @staticmethod
        def backward(ctx, do):
            if fails:
                raise RuntimeError("backward kernel launch failed")
            q, k, v = ctx.saved_tensors
            scale, causal, mask = ctx.args
            dq, dk, dv = fa2_backward(q, k, v, do, scale=scale, causal=causal, attn_mask=mask, bug=bug)
            if noisy:  # a race: the last bit of dq depends on the call
                dq = dq + (torch.rand(dq.shape) < 0.5).to(dq.dtype) * dq.abs() * 2.0**-9
            return dq, dk, dv, None, None, None

    @flashcheck.kernel(backward=True, deterministic_backward=deterministic, gqa=True, attn_mask=True,
                       causal=("none", "top_left", "bottom_right"), precision="strict", dtypes=("fp16", "fp32"))
    def attention(q, k, v, *, scale, causal, attn_mask=None):
        return Attention.apply(q, k, v, scale, causal, attn_mask)

    return attention


@pytest.mark.parametrize("upstream", ["random", "aligned", "zero_rows", "sparse"])
def test_pytorch_math_backward_passes_with_every_gradient_inside_its_budget(upstream):
    verdict = check_backward("torch:math", _case(masked_row=True), upstream=upstream, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert verdict.notes and "dq max error/budget" in verdict.notes[0]
    assert 0 <= verdict.max_ratio <= 1


def test_a_correct_fa2_backward_passes_and_a_missing_scale_in_dq_is_found_in_dq_alone():
    case = _case()
    assert check_backward(_fa2_kernel(), case, device="cpu").status == "PASS"
    verdict = check_backward(_fa2_kernel("scale_missing_in_dq"), case, device="cpu")
    assert verdict.status == "BUG"
    over = [f for f in verdict.findings if f.kind == "over_budget"]
    assert [f.details["gradient"] for f in over] == ["dq"]
    assert over[0].diagnosis.startswith("dq over its budget") and over[0].ratio > 1
    assert set(over[0].budget) == {"recompute", "products", "output_rounding", "oracle", "total"}


def test_gqa_gradients_not_summed_over_the_group_are_found_in_dk_and_dv_with_their_keys_and_heads():
    verdict = check_backward(_fa2_kernel("gqa_not_summed"), _case(), device="cpu")
    flagged = {f.details["gradient"] for f in verdict.findings if f.kind == "over_budget"}
    assert flagged == {"dk", "dv"}
    assert any("keys" in f.diagnosis and "K/V heads" in f.diagnosis for f in verdict.findings)


def test_a_backward_that_differs_between_identical_calls_breaks_its_promise():
    case = _case(dtype=torch.float32)
    verdict = check_backward(_fa2_kernel(noisy=True), case, device="cpu")
    assert any(f.kind == "nondeterminism" and f.details["gradient"] == "dq" for f in verdict.findings)
    unpromised = check_backward(_fa2_kernel(noisy=True, deterministic=False), case, device="cpu")
    assert not any(f.kind == "nondeterminism" for f in unpromised.findings)
    assert any(n.startswith("information: dq:") and n.endswith("(not promised)") for n in unpromised.notes)


def test_a_backward_that_raises_is_a_crash_finding():
    verdict = check_backward(_fa2_kernel(fails=True), _case(), device="cpu")
    assert verdict.status == "BUG" and verdict.findings[0].kind == "crash"
    assert "backward kernel launch failed" in verdict.findings[0].diagnosis
    assert math.isnan(verdict.max_ratio)


def test_a_kernel_without_a_backward_is_refused_with_the_fix():
    @flashcheck.kernel(dtypes=("fp16",))
    def forward_only(q, k, v, *, scale, causal, attn_mask=None):
        return q

    with pytest.raises(InvalidArgument, match="declares no backward pass.*backward=True"):
        check_backward(forward_only, _case(), device="cpu")


@pytest.mark.parametrize("exact, budget, got, legal", [
    (0.0, 1e6, math.inf, True),          # dS cancelling to noise that a large scale carries past 65,504
    (0.0, 1e6, -math.inf, True),
    (0.0, 10.0, math.inf, False),        # the budget's interval stays far inside fp16's range
    (6e4, 1e4, math.inf, True),          # an exact gradient near the top may round up to infinity
    (6e4, 1e4, -math.inf, False),        # ... but not to the other infinity
    (-6e4, 1e4, -math.inf, True),
])
def test_infinity_is_legal_only_where_the_budget_reaches_past_the_largest_value(exact, budget, got, legal):
    from flashcheck.judge.backward import compare_gradients
    from flashcheck.numerics.gradient_budget import gradient_budget

    case = _case(hq=1, hkv=1, nq=3, nk=4)
    do = torch.randn(case.q.shape[:3] + (case.v.shape[3],), generator=torch.Generator().manual_seed(0)).half()
    model = gradient_budget(case.q, case.k, case.v, do, scale=case.scale, causal=case.causal)
    grads = [model.gradients[n].to(torch.float16) for n in ("dq", "dk", "dv")]
    model.gradients["dk"][0, 0, 1, 2] = exact
    model.total["dk"][0, 0, 1, 2] = budget
    grads[1][0, 0, 1, 2] = got
    findings, _ = compare_gradients(grads, model)
    assert (not [f for f in findings if f.kind == "nonfinite"]) == legal, findings


def test_a_gradient_exclusion_skips_the_case_in_campaigns_and_leaves_a_direct_check_real():
    from pathlib import Path

    from flashcheck.judge.backward import upstream_gradient

    from ..robustness._kernels import BACKWARD_SPEC, autograd_attention

    @flashcheck.kernel(**BACKWARD_SPEC, backward_excludes=("ds_past_range",))
    def excluding(q, k, v, *, scale, causal, attn_mask=None):
        return autograd_attention(q, k, v, scale)

    # exact |dS| = 8.0e4 here, past fp16's 65,504 (the case torch:flash's backward overflows on)
    case = AttentionCase.load(Path(__file__).parents[1] / "gpu" / "sdpa_backward_cases" / "flash_fp16_ds_overflow.json")
    do = upstream_gradient(case, "cpu")
    skipped = check_backward(excluding, case, do=do, device="cpu", exclusions=True)
    assert skipped.skipped == "excluded: ds_past_range (an exact |dS| past fp16's 65504)"
    assert not skipped.findings and skipped.status == "PASS" and math.isnan(skipped.max_ratio)
    assert check_backward(excluding, case, do=do, device="cpu").skipped is None  # the real verdict
    assert check_backward(excluding, case, do=do / 2, device="cpu", exclusions=True).skipped is None  # |dS| 4e4


def test_backward_excludes_name_known_classes_and_join_excludes_for_backward_campaigns():
    from flashcheck.contract.spec import KernelSpec
    from flashcheck.errors import InvalidArgument

    spec = KernelSpec(excludes=("negative_scale",), backward_excludes=("tiny_scale", "negative_scale"))
    assert spec.for_backward().excludes == ("negative_scale", "tiny_scale")
    assert spec.for_backward().backward_excludes == () and spec.excludes == ("negative_scale",)
    with pytest.raises(InvalidArgument, match="backward_excludes"):
        KernelSpec(backward_excludes=("huge_ds",))


def test_a_nan_in_the_budget_leaves_that_element_unjudged_and_the_others_judged():
    from flashcheck.judge.backward import compare_gradients
    from flashcheck.numerics.gradient_budget import gradient_budget

    case = _case(hq=1, hkv=1, nq=3, nk=4)
    do = torch.randn(case.q.shape[:3] + (case.v.shape[3],), generator=torch.Generator().manual_seed(0)).half()
    model = gradient_budget(case.q, case.k, case.v, do, scale=case.scale, causal=case.causal)
    grads = [model.gradients[n].to(torch.float16) for n in ("dq", "dk", "dv")]
    model.total["dk"][0, 0, 0, 0] = model.total["dk"][0, 0, 1, 1] = math.nan
    grads[1][0, 0, 0, 0] += 1.0  # wrong, but unjudgeable there
    grads[1][0, 0, 1, 1] = math.inf  # infinite, unjudgeable too (H200, fp16 rows biased by -1e31, 2026-12-02)
    grads[1][0, 0, 2, 3] += 1.0  # wrong, and judged
    findings, worst = compare_gradients(grads, model)
    assert [f.index for f in findings] == [(0, 0, 2, 3)] and math.isfinite(worst["dk"])


def test_rows_with_no_visible_key_are_not_judged_when_the_spec_does_not_promise_zero_there():
    from ..robustness._kernels import BACKWARD_SPEC, autograd_attention

    spec = dict(BACKWARD_SPEC, causal=("none", "bottom_right"), attn_mask=True, fully_masked_rows="any")

    @flashcheck.kernel(**spec)
    def any_rows(q, k, v, *, scale, causal, attn_mask=None):
        return autograd_attention(q, k, v, scale)  # ignores the mask: wrong wherever a key is hidden

    masked = _case(hq=2, hkv=2, masked_row=True)  # row 5 of head 1 sees no key
    verdict = check_backward(any_rows, masked, device="cpu")
    assert verdict.skipped == "unsupported: rows with no visible key, whose gradients fully_masked_rows='any' leaves undefined"
    full = AttentionCase.create(masked.q, masked.k, masked.v, scale=masked.scale)  # every row sees every key
    assert check_backward(any_rows, full, device="cpu").skipped is None


def test_the_gpu_code_path_budget_left_nan_by_huge_logits_is_noted_not_judged(monkeypatch):
    # On the torch (GPU) path, huge logits make the recomputed P's error bound infinite, and zero rows of
    # dO multiply it into NaN: those elements cannot be judged, which the verdict says (an H200 campaign
    # crashed on this before)
    from flashcheck.contract.validation import Shapes
    from flashcheck.inputs.regimes import make_upstream
    from flashcheck.inputs.recipe import Recipe

    monkeypatch.setenv("FLASHCHECK_TORCH_OPS", "1")
    shapes = Shapes(batch=1, heads_q=2, heads_kv=1, n_q=1, n_k=2, head_dim=128, head_dim_v=128)
    base = Recipe(shapes=shapes, dtype="bf16", values="huge_logits", seed=0).build()
    case = AttentionCase.create(base.q, base.k, base.v, scale=5.65685, attn_mask=torch.tensor([True, True]).view(1, 1, 1, 2))
    do = make_upstream("zero_rows", out=torch.zeros(1, 2, 1, 128), dtype=torch.bfloat16, seed=0)
    verdict = check_backward("torch:math", case, do=do, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert any(n.startswith("information: ") and "of dv not judged" in n for n in verdict.notes), verdict.notes
