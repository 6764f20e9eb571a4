"""check() and assert_attention_close(): every finding kind the verdict can carry, on purpose-built kernels."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.contract.masks import visible
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_mask, make_values
from flashcheck.judge.check import assert_attention_close, check
from flashcheck.numerics.budget import TERMS
from flashcheck.numerics.twin import twin_attention

SPEC = dict(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
            fully_masked_rows="zero", precision="flash")


def twin(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, precision="flash")


def variant(edit, **spec):
    """The twin with one defect applied to its (out, lse)."""

    def kernel(q, k, v, *, scale, causal, attn_mask=None):
        return edit(*twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask), q=q, k=k, v=v, scale=scale)

    return flashcheck.kernel(kernel, **{**SPEC, **spec})


def make_case(dtype="fp16", shapes=Shapes(1, 2, 1, 70, 90, 32, 32), mask="none", causal="none", values="random"):
    q, k, v = make_values(values, shapes=shapes, dtype=dtype, seed=3)
    return AttentionCase.create(q, k, v, scale=shapes.head_dim ** -0.5, causal=causal,
                                attn_mask=make_mask(mask, shapes=shapes, seed=3))


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_correct_kernel_passes(dtype):
    verdict = check(flashcheck.kernel(twin, **SPEC), make_case(dtype, mask="fully_masked_rows",
                                                               causal="bottom_right"), device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert 0 <= verdict.max_ratio <= 1


def test_device_with_an_index_is_the_device_of_the_inputs():
    """device="cuda" puts the inputs on cuda:0; an output there is where it should be (here: cpu:0 vs cpu)."""
    verdict = check(flashcheck.kernel(twin, **SPEC), make_case(), device="cpu:0")
    assert verdict.status == "PASS", str(verdict)


def test_a_kernel_name_resolves_as_on_the_command_line():
    verdict = check("torch:math", make_case(), device="cpu")
    assert verdict.status == "PASS" and verdict.kernel == "torch:math", str(verdict)
    with pytest.raises(flashcheck.InvalidArgument, match="torch:nope"):
        check("torch:nope", make_case(), device="cpu")


def test_over_budget_carries_the_worst_element_and_its_terms():
    kernel = variant(lambda out, lse, scale, **_: (out * (1 + 2**-6), lse))
    verdict = check(kernel, make_case(), device="cpu")
    assert verdict.status == "BUG"
    (finding,) = [f for f in verdict.findings if f.kind == "over_budget"]
    assert finding.ratio > 1 and finding.error > 0 and len(finding.index) == 4
    assert set(TERMS) | {"total"} == set(finding.budget)
    assert math.isclose(finding.budget["total"], sum(finding.budget[t] for t in TERMS), rel_tol=1e-12)
    assert "every head" in finding.diagnosis and "worst element" in str(verdict)


def test_tail_tile_defect_is_diagnosed_as_tail():
    def corrupt_tail(out, lse, **_):
        out = out.clone()
        out[:, :, 64:] = out[:, :, 64:] * 1.05
        return out, lse

    verdict = check(variant(corrupt_tail), make_case(), device="cpu")
    (finding,) = [f for f in verdict.findings if f.kind == "over_budget"]
    assert "partial tail tile (rows 64..69; tiles of 16, 32, 64)" in finding.diagnosis


def over_keys(keys):
    """The twin over other keys: ``keys(visible)`` returns the (B, H, Nq, Nk) keys it really attends."""

    def kernel(q, k, v, *, scale, causal, attn_mask=None):
        shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return twin(q, k, v, scale=scale, causal="none", attn_mask=keys(visible(causal, attn_mask, shape)))

    return flashcheck.kernel(kernel, **SPEC)


def without_tail_keys(vis):
    vis = vis.clone()
    vis[..., -5:] = False  # a kernel that never reads its last partial key tile
    return vis


def without_diagonal(vis):
    return vis & ~torch.eye(vis.shape[-2], vis.shape[-1], dtype=torch.bool)


def without_mask(vis):
    return torch.ones_like(vis)


@pytest.mark.parametrize("keys, case, words", [
    (without_tail_keys, dict(), "keys 85..89 (5 visible) left out"),
    (without_diagonal, dict(causal="top_left"), "(the causal diagonal) left out"),
    (without_mask, dict(mask="key_padding_right"), "let in"),
])
def test_attention_over_other_keys_is_named(keys, case, words):
    verdict = check(over_keys(keys), make_case("fp32", **case), device="cpu", properties=())
    (finding,) = [f for f in verdict.findings if f.kind == "over_budget"]
    assert words in finding.diagnosis, finding.diagnosis
    assert " matches attention with " in finding.diagnosis


def test_no_key_set_is_claimed_for_a_defect_outside_the_softmax():
    verdict = check(variant(lambda out, lse, **_: (out * 1.05, lse)), make_case(), device="cpu",
                    properties=())
    (finding,) = [f for f in verdict.findings if f.kind == "over_budget"]
    assert "matches attention with" not in finding.diagnosis


def test_crash_is_a_finding_with_traceback():
    def boom(q, k, v, *, scale, causal, attn_mask=None):
        raise RuntimeError("illegal tile")

    verdict = check(flashcheck.kernel(boom, **SPEC), make_case(), device="cpu")
    assert verdict.status == "BUG" and verdict.findings[0].kind == "crash"
    assert "illegal tile" in verdict.findings[0].diagnosis
    assert "RuntimeError" in verdict.findings[0].details["traceback"]


@pytest.mark.parametrize("edit, words", [
    (lambda out, lse, **_: (out[:, :, :-1], lse), "shape"),
    (lambda out, lse, **_: (out.float(), lse), "dtype"),
    (lambda out, lse, **_: (out[..., 0].tolist(), lse), "not a tensor"),
])
def test_wrong_output_is_a_finding(edit, words):
    verdict = check(variant(edit), make_case(), device="cpu")
    assert verdict.status == "BUG" and verdict.findings[0].kind == "wrong_output"
    assert words in verdict.findings[0].diagnosis


def test_nonfinite_output():
    def poison(out, lse, **_):
        out = out.clone()
        out[0, 1, 5, 3] = float("nan")
        return out, lse

    verdict = check(variant(poison), make_case(), device="cpu")
    assert [f.kind for f in verdict.findings] == ["nonfinite"]
    assert verdict.findings[0].index == (0, 1, 5, 3)


def test_fully_masked_row_promise():
    case = make_case(mask="fully_masked_rows")
    assert bool(case.empty_rows().any())

    def nan_rows(out, lse, **_):
        out = out.clone()
        out[torch.isinf(lse)] = float("nan")
        return out, lse

    broken = check(variant(nan_rows), case, device="cpu")
    assert [f.kind for f in broken.findings] == ["masked_row_promise"]
    assert check(variant(nan_rows, fully_masked_rows="nan"), case, device="cpu").status == "PASS"
    assert check(variant(nan_rows, fully_masked_rows="any"), case, device="cpu").status == "PASS"


def test_wrong_lse():
    verdict = check(variant(lambda out, lse, **_: (out, lse + 1e-3)), make_case(), device="cpu")
    assert [f.kind for f in verdict.findings] == ["lse"]


def test_assert_attention_close():
    case = make_case("bf16", causal="top_left")
    ref = flashcheck.reference_attention(case.q, case.k, case.v, scale=case.scale, causal="top_left")
    out, lse = twin(case.q, case.k, case.v, scale=case.scale, causal="top_left")
    assert assert_attention_close(out, ref, precision="flash", lse=lse).status == "PASS"
    with pytest.raises(AssertionError, match="over_budget"):
        assert_attention_close(out * 1.02, ref, precision="flash")
    with pytest.raises(flashcheck.InvalidArgument, match="reference"):
        assert_attention_close(out, out, precision="flash")


def test_assert_attention_close_names_what_it_judged():
    case = make_case("bf16", causal="top_left")
    ref = flashcheck.reference_attention(case.q, case.k, case.v, scale=case.scale, causal="top_left")
    out, _ = twin(case.q, case.k, case.v, scale=case.scale, causal="top_left")
    inputs = case.describe().replace(" layout=contiguous", "")  # the tensors say no layout of a case
    with pytest.raises(AssertionError) as failed:
        assert_attention_close(out * 1.02, ref, precision="flash")
    assert str(failed.value).splitlines()[0] == f"BUG: the output on {inputs}"
    with pytest.raises(AssertionError) as failed:
        assert_attention_close(out * 1.02, ref, precision="flash", name="my_attention")
    assert str(failed.value).splitlines()[0] == f"BUG: my_attention on {inputs}"
    with pytest.raises(flashcheck.InvalidArgument, match="^name="):
        assert_attention_close(out, ref, precision="flash", name=3)


def test_check_refuses_a_non_case():
    with pytest.raises(flashcheck.InvalidArgument, match="^case="):
        check(twin, "not a case")


def test_growth_with_length():
    from flashcheck.judge.diagnose import growth_with_length

    grows = [(n, n * 0.5 + 1) for n in (16, 33, 64, 100, 200)]
    assert "grows with the number of keys" in growth_with_length(grows)
    assert growth_with_length([(n, 3.0 if n % 2 else 9.0) for n in (16, 33, 64, 100, 201)]) is None
    assert growth_with_length(grows[:3]) is None  # too few lengths to say
