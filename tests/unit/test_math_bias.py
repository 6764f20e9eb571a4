"""torch:math and torch:flash (CPU) with attn_bias and symmetric ALiBi in SDPA's float attn_mask, against the
float64 reference of tests/unit/test_flex_variants.py, with the boolean mask and every causal alignment."""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck import Variant
from flashcheck.contract.validation import check_attention_inputs
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.sdpa import _float_mask

from .test_flex_variants import HQ, NK, NQ, B, assert_close, inputs, variants

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
    """The mask is fp32 where ALiBi or an fp32 bias needs it, else the inputs' dtype (exact for 0 and -inf)."""
    q, k, v = inputs(torch.float16)
    shapes = check_attention_inputs(q, k, v, scale=0.3, causal="none")[-1]
    half = torch.randn(NQ, NK).half()
    assert _float_mask(half, None, None, "top_left", shapes, q.dtype, "cpu").dtype == torch.float16
    assert _float_mask(half.float(), None, None, "none", shapes, q.dtype, "cpu").dtype == torch.float32
    mask = _float_mask(None, torch.rand(HQ), None, "bottom_right", shapes, q.dtype, "cpu")
    assert mask.dtype == torch.float32 and mask.shape == (B, HQ, NQ, NK)
    assert bool((mask[..., 0, NK - NQ + 1:] == -math.inf).all()) and bool(torch.isfinite(mask[..., -1, :]).all())


def test_variant_kwargs_reach_sdpa_unchanged(kernel):
    """Variant.kwargs (what flashcheck.check passes) gives the same bits as the tensors themselves."""
    q, k, v = inputs(torch.bfloat16, seed=19)
    variant = variants(torch.bfloat16)["bias"]
    direct = kernel(q, k, v, scale=0.3, causal="none", **variant)
    via = kernel(q, k, v, scale=0.3, causal="none", **Variant(**variant).kwargs())
    assert torch.equal(direct, via)
