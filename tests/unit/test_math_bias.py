"""torch:math and torch:flash (CPU) with attn_bias and symmetric ALiBi in SDPA's float attn_mask, and the
example kernel of examples/variants with them and its planted bias bugs, against the float64 reference of
tests/unit/test_flex_variants.py, with the boolean mask and every causal alignment."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from flashcheck import Variant
from flashcheck.contract.validation import check_attention_inputs
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.sdpa import _float_mask

from .test_flex_variants import HQ, NK, NQ, B, assert_close, inputs, variants, verdict

BIASED = ["alibi", "alibi_per_batch", "bias", "bias_fp32_rows", "bias_hides"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture(scope="module", params=["torch:math", "torch:flash"])
def kernel(request):
    return resolve_kernel(request.param, device="cpu")


def test_specs_declare_the_float_mask(kernel):
    spec = kernel.spec
    assert spec.attn_bias and spec.fp32_bias and spec.alibi == "symmetric"
    assert not (spec.softcap or spec.window or spec.chunk or spec.sinks)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("name", BIASED)
def test_bias_matches_float64(kernel, name, causal, dtype):
    q, k, v = inputs(dtype, seed=11)
    assert_close(kernel, q, k, v, causal=causal, variant=variants(dtype)[name])


@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
def test_bias_alibi_and_boolean_mask_together(kernel, causal):
    q, k, v = inputs(torch.float16, seed=13)
    mask = torch.rand(B, 1, NQ, NK, generator=torch.Generator().manual_seed(2)) > 0.3
    variant = dict(attn_bias=torch.randn(HQ, NQ, NK).to(torch.float16), alibi_slopes=torch.rand(HQ))
    assert_close(kernel, q, k, v, causal=causal, variant=variant, mask=mask)


def test_more_queries_than_keys_bottom_right(kernel):
    """Rows with no visible key (Nq > Nk, bottom-right) stay 0 with a bias."""
    q, k, v = inputs(torch.float32, seed=17, n_q=NK + 4)
    variant = dict(attn_bias=torch.randn(NK + 4, NK), alibi_slopes=torch.rand(B, HQ))
    assert_close(kernel, q, k, v, causal="bottom_right", variant=variant)


def test_float_mask_dtype():
    """The mask is fp32 where the backend takes it (so that dbias is summed before its one rounding), or where
    ALiBi or an fp32 bias needs it; else the inputs' dtype (exact for 0 and -inf)."""
    q, k, v = inputs(torch.float16)
    shapes = check_attention_inputs(q, k, v, scale=0.3, causal="none")[-1]
    half = torch.randn(NQ, NK).half()
    assert _float_mask(half, None, None, "top_left", shapes, q.dtype, "cpu", fp32=True).dtype == torch.float32
    assert _float_mask(half, None, None, "top_left", shapes, q.dtype, "cpu", fp32=False).dtype == torch.float16
    assert _float_mask(half.float(), None, None, "none", shapes, q.dtype, "cpu", fp32=False).dtype == torch.float32
    mask = _float_mask(None, torch.rand(HQ), None, "bottom_right", shapes, q.dtype, "cpu", fp32=False)
    assert mask.dtype == torch.float32 and mask.shape == (B, HQ, NQ, NK)
    assert bool((mask[..., 0, NK - NQ + 1:] == -math.inf).all()) and bool(torch.isfinite(mask[..., -1, :]).all())


def test_variant_kwargs_reach_sdpa_unchanged(kernel):
    """Variant.kwargs (what flashcheck.check passes) gives the same bits as the tensors themselves."""
    q, k, v = inputs(torch.bfloat16, seed=19)
    variant = variants(torch.bfloat16)["bias"]
    direct = kernel(q, k, v, scale=0.3, causal="none", **variant)
    via = kernel(q, k, v, scale=0.3, causal="none", **Variant(**variant).kwargs())
    assert torch.equal(direct, via)


# ------------------------------------------------------------------------------------------------
# The example kernel (examples/variants/variant_kernels.py): ALiBi and attn_bias, and its planted bugs
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example():
    path = Path(__file__).resolve().parents[2] / "examples" / "variants" / "variant_kernels.py"
    spec = importlib.util.spec_from_file_location("variant_kernels_bias_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("causal", ["none", "bottom_right"])
@pytest.mark.parametrize("name", BIASED + ["cap_and_bias", "everything"])
def test_example_correct_takes_alibi_and_bias(example, name, causal):
    assert example.correct.spec.alibi == "symmetric" and example.correct.spec.fp32_bias
    q, k, v = inputs(torch.float16, seed=23)
    assert_close(example.correct, q, k, v, causal=causal, variant=variants(torch.float16)[name])


PLANTED = {
    "alibi_top_left": "alibi",  # Nq != Nk: the top-left distance is another bias
    "bias_scaled": "bias",
    "bias_one_head": "cap_and_bias",  # a bias of one row per head: head 0's differs from the others
}


@pytest.mark.parametrize("bug", list(PLANTED))
def test_example_planted_bias_bugs_differ_from_float64(example, bug):
    q, k, v = inputs(torch.float32, seed=29)
    variant = dict(variants(torch.float32)[PLANTED[bug]])
    if bug == "bias_one_head":
        variant["attn_bias"] = torch.randn(HQ, NQ, NK)
    with pytest.raises(AssertionError, match="max error"):
        assert_close(getattr(example, bug), q, k, v, causal="none", variant=variant)
    assert_close(example.correct, q, k, v, causal="none", variant=variant)


# ------------------------------------------------------------------------------------------------
# flashcheck.check's verdicts
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("name", BIASED)
def test_check_passes_sdpa_with_bias(kernel, name, dtype):
    result = verdict(kernel, variants(dtype)[name], dtype=dtype)
    assert result.status == "PASS", [f.summary() for f in result.findings]


@pytest.mark.parametrize("name", BIASED + ["cap_and_bias", "everything"])
def test_check_passes_example_correct(example, name):
    result = verdict(example.correct, variants(torch.float16)[name])
    assert result.status == "PASS", [f.summary() for f in result.findings]


@pytest.mark.parametrize("bug", list(PLANTED))
def test_check_finds_each_planted_bias_bug(example, bug):
    variant = dict(variants(torch.float16)[PLANTED[bug]])
    if bug == "bias_one_head":
        variant["attn_bias"] = torch.randn(HQ, NQ, NK)
    result = verdict(getattr(example, bug), variant)
    assert result.status == "BUG" and any(f.kind == "over_budget" for f in result.findings), result.findings
