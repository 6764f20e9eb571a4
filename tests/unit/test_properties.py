"""Exact properties: each defect class breaks its property, and a careful kernel keeps all of them."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_mask, make_values
from flashcheck.judge.check import check
from flashcheck.judge.properties import hidden_keys
from flashcheck.numerics.twin import Tiling, twin_attention

SPEC = dict(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
            fully_masked_rows="zero", precision="flash")


def twin(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


def padded_case(dtype="fp16"):
    s = Shapes(2, 2, 1, 40, 50, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype=dtype, seed=5)
    return AttentionCase.create(q, k, v, scale=0.25, causal="top_left",
                                attn_mask=make_mask("key_padding_right", shapes=s, seed=5))


def kinds(verdict):
    return sorted({f.kind for f in verdict.findings})


def test_careful_kernel_keeps_every_property():
    case = padded_case()
    assert bool(hidden_keys(case).any()), "the case must have keys no query sees"
    verdict = check(flashcheck.kernel(twin, **SPEC), case, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert "properties" in verdict.elapsed


def test_nan_in_masked_keys_leaks_through_a_full_product():
    @flashcheck.kernel(**SPEC, nan_safe_masking=True)
    def unmasked_v_load(q, k, v, *, scale, causal, attn_mask=None):
        out, lse = twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        return out + 0 * v.sum(dim=2, keepdim=True).to(out.dtype), lse  # reads every V row

    verdict = check(unmasked_v_load, padded_case(), device="cpu")
    assert kinds(verdict) == ["poison_leak"] and "masked-out keys" in verdict.findings[0].diagnosis


def test_the_sign_of_a_zero_is_not_a_leak():
    """0 * v keeps the sign of v: PyTorch's math backend on CUDA writes -0 on a fully masked row whose
    hidden key has v < 0, and +0 once that key is poisoned with a huge positive value."""
    s = Shapes(1, 2, 2, 1, 1, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp32", seed=1)
    case = AttentionCase.create(q, k, v, scale=0.25, attn_mask=torch.tensor([True, False]).view(1, 2, 1, 1))

    @flashcheck.kernel(**SPEC, nan_safe_masking=False)
    def zero_times_v(q, k, v, *, scale, causal, attn_mask=None):
        out, lse = twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        return torch.where(out == 0, 0.0 * v[:, :, -1:].clamp(-1, 1), out), lse

    out, _ = zero_times_v(case.q, case.k, case.v, scale=case.scale, causal="none", attn_mask=case.attn_mask)
    assert bool(torch.signbit(out[0, 1]).any()) and bool((out[0, 1] == 0).all())  # -0 on the masked row
    verdict = check(zero_times_v, case, device="cpu", properties=("poison",))
    assert verdict.status == "PASS", str(verdict)


def test_out_of_bounds_read_shows_in_guard_bands():
    @flashcheck.kernel(**SPEC)
    def reads_one_row_past_v(q, k, v, *, scale, causal, attn_mask=None):
        out, lse = twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        # The element just past v's last one, as a kernel with a missing bounds check reads it
        # (torch itself refuses to read past the storage, so only memory that exists is read).
        end = v.storage_offset() + sum((n - 1) * st for n, st in zip(v.shape, v.stride())) + 1
        if end < v.untyped_storage().nbytes() // v.element_size():
            out = out + 0 * torch.as_strided(v, (1,), (1,), end).to(out.dtype)
        return out, lse

    verdict = check(reads_one_row_past_v, padded_case(), device="cpu", properties=("guard_bands",))
    assert kinds(verdict) == ["poison_leak"] and "out-of-bounds" in verdict.findings[0].diagnosis


def layout_sensitive(edit):
    """The twin, with another code path (``edit`` of its output) for strided K."""

    def kernel(q, k, v, *, scale, causal, attn_mask=None):
        if k.is_contiguous():
            return twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        return edit(q.contiguous(), k.contiguous(), v.contiguous(), scale=scale, causal=causal, attn_mask=attn_mask)

    return kernel


def test_layout_that_breaks_the_budget_is_a_bug():
    def wrong(q, k, v, **kw):
        out, lse = twin(q, k, v, **kw)
        return (out.float() * 1.01).to(out.dtype), lse

    verdict = check(flashcheck.kernel(layout_sensitive(wrong), **SPEC), padded_case(), device="cpu",
                    properties=("layout",))
    assert kinds(verdict) == ["layout_dependence"]
    (finding,) = verdict.findings
    assert finding.ratio > 1 and "strided layout" in finding.diagnosis and "over_budget" in finding.diagnosis


def test_layout_with_other_legal_rounding_is_a_note_unless_invariance_is_promised():
    def other_tiling(q, k, v, **kw):  # another legal reordering: other bits, inside the budget
        return twin_attention(q, k, v, tiling=Tiling(block_n=16, key_order=torch.arange(k.shape[2]).flip(0)), **kw)

    kernel = layout_sensitive(other_tiling)
    verdict = check(flashcheck.kernel(kernel, **SPEC), padded_case(), device="cpu", properties=("layout",))
    assert verdict.status == "PASS", str(verdict)
    assert any(n.startswith("layout-dependent bits within the budget") for n in verdict.notes), verdict.notes
    strict = check(flashcheck.kernel(kernel, **SPEC, layout_invariant=True), padded_case(), device="cpu",
                   properties=("layout",))
    assert kinds(strict) == ["layout_dependence"]


def test_nondeterminism():
    calls = []

    @flashcheck.kernel(**SPEC)
    def racy(q, k, v, *, scale, causal, attn_mask=None):
        calls.append(1)
        out, lse = twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        if len(calls) % 2 == 0:  # an atomic-add order that changes from run to run
            out = out.clone()
            out.view(torch.int16)[0, 0, 3, 1] += 1  # one ulp
        return out, lse

    verdict = check(racy, padded_case(), device="cpu", properties=("determinism",))
    assert kinds(verdict) == ["nondeterminism"]
    relaxed = flashcheck.kernel(racy.fn, **SPEC, deterministic=False)
    assert check(relaxed, padded_case(), device="cpu", properties=("determinism",)).status == "PASS"


def test_systematic_error_inside_the_budget_is_suspicious():
    s = Shapes(1, 2, 2, 64, 256, 32, 32)
    q, k, v = make_values("positive_v", shapes=s, dtype="fp32", seed=1)
    case = AttentionCase.create(q, k, v, scale=32 ** -0.5)

    @flashcheck.kernel(**{**SPEC, "precision": "strict"})
    def biased(q, k, v, *, scale, causal, attn_mask=None):
        out, lse = twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, precision="strict")
        return out * (1 + 2.0**-17), lse  # 128 ulps of bias on every element

    verdict = check(biased, case, device="cpu", properties=())
    assert verdict.status == "SUSPICIOUS", str(verdict)
    (finding,) = verdict.findings
    assert finding.kind == "reordering_outlier" and finding.details["envelope"] * 8 < verdict.max_ratio <= 1


@pytest.mark.parametrize("properties", [(), ("determinism", "poison", "guard_bands", "layout")])
def test_properties_are_optional(properties):
    verdict = check(flashcheck.kernel(twin, **SPEC), padded_case(), device="cpu", properties=properties)
    assert verdict.status == "PASS" and ("properties" in verdict.elapsed) == bool(properties)


def test_batch_dependence_is_information_unless_promised():
    s = Shapes(3, 2, 1, 20, 30, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp16", seed=2)
    case = AttentionCase.create(q, k, v, scale=0.25)

    def batch_sized(q, k, v, *, scale, causal, attn_mask=None):
        out, lse = twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        if q.shape[0] > 1:  # a split chosen by batch size: other rounding, still legal
            out = out.clone()
            out.view(torch.int16)[-1, 0, 0, 0] += 1
        return out, lse

    relaxed = check(flashcheck.kernel(batch_sized, **SPEC), case, device="cpu", properties=("batch",))
    assert relaxed.status == "PASS" and relaxed.properties == ["batch"]
    assert relaxed.notes and relaxed.notes[0].startswith("batch-dependent")
    strict = check(flashcheck.kernel(batch_sized, **SPEC, batch_invariant=True), case, device="cpu",
                   properties=("batch",))
    assert kinds(strict) == ["batch_dependence"]
    assert check(flashcheck.kernel(twin, **SPEC, batch_invariant=True), case, device="cpu",
                 properties=("batch",)).notes == []


def test_no_property_runs_after_a_rerun_crashed():
    """A crashed rerun may leave the process unusable (a sticky CUDA error): the other properties wait."""
    calls = []

    @flashcheck.kernel(**SPEC)
    def crashes_on_its_second_call(q, k, v, *, scale, causal, attn_mask=None):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return twin(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)

    verdict = check(crashes_on_its_second_call, padded_case(), device="cpu")
    assert kinds(verdict) == ["crash"] and len(calls) == 2
