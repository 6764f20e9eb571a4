"""nan_safe_masking is a promise some kernels make, off by default: a plain masked kernel (0 x NaN for a masked
key's V row) passes with the default spec; a kernel that makes the promise and breaks it is told which field
to set; the built-in kernels keep their promise as before."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashcheck
from flashcheck.campaign.causes import root_cause
from flashcheck.campaign.config import CampaignConfig, Target
from flashcheck.campaign.run import run_campaign
from flashcheck.contract.spec import DEFAULT_SPEC, KernelSpec, as_kernel
from flashcheck.inputs.presets import load_preset
from flashcheck.kernels.registry import available_kernels, resolve_kernel

from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.regimes import make_mask, make_values

from .test_properties import kinds

NO_PROMISE = "If the kernel makes no such promise, declare nan_safe_masking=False in its @flashcheck.kernel spec"


def sdpa_with_a_bool_mask(q, k, v, *, scale, causal, attn_mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)


def masked_fill_then_softmax(q, k, v, *, scale, causal, attn_mask=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf"))
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)  # a masked key's weight is 0, and 0 x NaN is NaN


NEWCOMERS = [sdpa_with_a_bool_mask, masked_fill_then_softmax]


def padded_case() -> AttentionCase:
    """What the default spec draws (no causal mode, no GQA), with a padding mask: keys no query sees."""
    s = Shapes(2, 2, 2, 40, 50, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp32", seed=5)
    return AttentionCase.create(q, k, v, scale=0.25, attn_mask=make_mask("key_padding_right", shapes=s, seed=5))


def test_a_plain_callable_and_a_bare_decorator_get_the_same_default_spec():
    plain, decorated = as_kernel(masked_fill_then_softmax), flashcheck.kernel(masked_fill_then_softmax)
    assert plain.spec == decorated.spec == DEFAULT_SPEC == KernelSpec()
    assert DEFAULT_SPEC.nan_safe_masking is False


@pytest.mark.parametrize("fn", NEWCOMERS)
def test_a_plain_masked_kernel_keeps_every_property_with_the_default_spec(fn):
    verdict = flashcheck.check(flashcheck.kernel(fn, attn_mask=True), padded_case(), device="cpu")
    assert verdict.status == "PASS" and "poison" in verdict.properties, str(verdict)


@pytest.mark.parametrize("fn", NEWCOMERS)
def test_a_plain_masked_kernel_passes_a_short_campaign_with_the_default_spec(fn, tmp_path):
    target = Target(flashcheck.kernel(fn, attn_mask=True), "cpu", load_preset("smoke"), ("fp32",))
    result = run_campaign(CampaignConfig(target).replace(max_examples=40, seed=2, corpus=tmp_path))
    assert result.verdict == "PASS", result.findings
    assert result.properties["cases"]["poison"] > 0  # cases with masked-out keys met the poison property


def test_a_kernel_that_promises_nan_safe_masking_and_reads_masked_keys_is_told_which_field_to_set():
    promised = flashcheck.kernel(masked_fill_then_softmax, attn_mask=True, nan_safe_masking=True)
    verdict = flashcheck.check(promised, padded_case(), device="cpu", properties=("poison",))
    assert kinds(verdict) == ["poison_leak"] and root_cause(verdict).key == "reads:masked_keys", str(verdict)
    assert NO_PROMISE in verdict.findings[0].diagnosis, verdict.findings[0].diagnosis


def test_a_broken_default_promise_of_determinism_names_its_field():
    calls = []

    def drifts(q, k, v, *, scale, causal, attn_mask=None):
        calls.append(1)
        out = masked_fill_then_softmax(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
        return out if len(calls) % 2 else torch.nextafter(out, torch.full_like(out, 9.0))

    verdict = flashcheck.check(flashcheck.kernel(drifts, attn_mask=True), padded_case(), device="cpu",
                               properties=("determinism",))
    assert kinds(verdict) == ["nondeterminism"], str(verdict)
    assert "declare deterministic=False in its @flashcheck.kernel spec" in verdict.findings[0].diagnosis


# What each built-in kernel that runs here promises: what it promised before the default changed.
BUILT_IN_PROMISES = {"torch:math": False, "torch:flash": False, "torch:flex": False, "flashcheck:triton": True,
                     "torch:varlen": False, "torch:paged": False, "torch:jagged": True, "torch:split-kv": True,
                     "torch:flex-varlen": False, "flashcheck:triton-varlen": True, "flashcheck:triton-paged": True,
                     "flashcheck:triton-split-kv": True, "torch:fp8": True, "torch:mla": False, "torch:mla-paged": True,
                     "torch:mla-fp8": False,
                     "flashcheck:triton-mla": True, "torch:sparse": False, "flashcheck:triton-sparse": True,
                     "torch:sparse-varlen": True, "torch:sparse-paged": True, "torch:mla-sparse": True,
                     "torch:block-sparse": False, "torch:flex-block-sparse": False,
                     "flashcheck:triton-block-sparse": True, "torch:fp8-kv-token": True, "torch:fp8-kv-blocks": True,
                     "torch:fp8-kv-tensor": True,
                     "torch:mxfp8": True, "flashcheck:triton-fp8-kv-blocks": True, "sage:sageattn": False,
                     "sage:sageattn-varlen": False, "torch:int8-qk": True, "torch:nvfp4": True}


@pytest.mark.parametrize("name", sorted(set(available_kernels("cpu")) & set(BUILT_IN_PROMISES)))
def test_the_built_in_kernels_keep_their_nan_safe_masking(name):
    assert resolve_kernel(name, device="cpu").spec.nan_safe_masking is BUILT_IN_PROMISES[name]


def test_every_built_in_kernel_that_runs_here_is_pinned():
    assert set(available_kernels("cpu")) <= set(BUILT_IN_PROMISES)


def test_a_serving_kernel_that_promises_nan_safe_masking_and_reads_poison_is_told_which_field_to_set():
    from flashcheck.inputs.packing import serving_case

    planted = resolve_kernel("torch:varlen~reads_past_end", device="cpu")  # attends the key past each sequence's end
    promised = flashcheck.Kernel(planted.fn, planted.spec.replace(nan_safe_masking=True), name="reads_past_end")
    s = Shapes(3, 2, 2, 6, 20, 16, 16)
    q, k, v = make_values("random", shapes=s, dtype="fp32", seed=1)
    case = serving_case(AttentionCase.create(q, k, v, scale=0.25), form="varlen", packing="ragged", pages="none",
                        poison="nan", seed=1)
    verdict = flashcheck.check(promised, case, device="cpu", properties=())
    nonfinite = [f for f in verdict.findings if f.kind == "nonfinite"]
    assert nonfinite and all(NO_PROMISE in f.diagnosis for f in nonfinite), str(verdict)
