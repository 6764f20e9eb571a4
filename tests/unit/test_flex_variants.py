"""torch:flex with every variant (cap, ALiBi, bias, window, chunk, sinks) against a float64 reference
written here from the variant contract: flex's eager path always, its compiled C++ kernel where a C++
compiler is present (slow: a few seconds per new shape)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from flashcheck import Variant
from flashcheck.kernels.registry import resolve_kernel

B, HQ, HKV, NQ, NK, D = 2, 4, 2, 13, 21, 16
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def reference(q, k, v, *, scale, causal="none", attn_mask=None, softcap=None, alibi_slopes=None, attn_bias=None,
              window=None, chunk=None, sinks=None, bias_order="cap_first"):
    """(out, lse) in float64, straight from the contract (flashcheck/contract/variants.py)."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    n_q, n_k = q.shape[2], k.shape[2]
    i, j = torch.arange(n_q).view(-1, 1), torch.arange(n_k).view(1, -1)
    centre = i + n_k - n_q
    bias = torch.zeros((), dtype=torch.float64)
    if alibi_slopes is not None:
        slopes = alibi_slopes.double()
        bias = bias - slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * (centre - j).abs()
    if attn_bias is not None:
        bias = bias + attn_bias.double()
    s = scale * q @ k.transpose(-1, -2)
    cap = (lambda x: softcap * torch.tanh(x / softcap)) if softcap not in (None, math.inf) else (lambda x: x)
    s = cap(s) + bias if bias_order == "cap_first" else cap(s + bias)
    vis = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal != "none":
        vis &= j <= (i if causal == "top_left" else centre)
    if window is not None:
        vis &= (j >= centre - window[0]) | (window[0] < 0)
        vis &= (j <= centre + window[1]) | (window[1] < 0)
    if chunk is not None:
        vis &= centre // chunk == j // chunk
    if attn_mask is not None:
        vis = vis & attn_mask
    s = s.masked_fill(~vis, -math.inf)
    if sinks is not None:  # a key of score sink and value 0
        sink = sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)
        s, v = torch.cat([s, sink], -1), torch.cat([v, v.new_zeros(v.shape[:2] + (1, v.shape[3]))], 2)
    lse = torch.logsumexp(s, -1)
    p = torch.where(lse[..., None] == -math.inf, 0.0, torch.exp(s - lse[..., None]))
    return p @ v, lse


def inputs(dtype, seed=0, n_q=NQ, n_k=NK):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, n_q, D, generator=g)
    k = torch.randn(B, HKV, n_k, D, generator=g)
    v = torch.randn(B, HKV, n_k, D, generator=g) + 0.5
    return tuple(t.to(dtype) for t in (q, k, v))


def variants(dtype):
    g = torch.Generator().manual_seed(7)
    hidden = torch.where(torch.rand(1, HQ, NQ, NK, generator=g) > 0.5, 0.0, -math.inf)
    hidden[..., 3, :] = -math.inf  # a row with no visible key
    return {
        "softcap": dict(softcap=1.5),
        "softcap_inf": dict(softcap=math.inf),
        "alibi": dict(alibi_slopes=torch.rand(HQ, generator=g)),
        "alibi_per_batch": dict(alibi_slopes=torch.rand(B, HQ, generator=g)),
        "bias": dict(attn_bias=torch.randn(B, 1, NQ, NK, generator=g).to(dtype)),
        "bias_fp32_rows": dict(attn_bias=3 * torch.randn(NQ, 1, generator=g)),
        "bias_hides": dict(attn_bias=hidden),
        "cap_and_bias": dict(softcap=2.0, attn_bias=torch.randn(NQ, NK, generator=g),
                             alibi_slopes=torch.rand(HQ, generator=g)),
        "window": dict(window=(4, 1)),
        "window_left_only": dict(window=(-1, 2)),
        "chunk": dict(chunk=5),
        "sinks": dict(sinks=3 * torch.randn(HQ, generator=g)),
        "sinks_some_inf": dict(sinks=torch.tensor([0.5, -math.inf, 4.0, -2.0])),
        "everything": dict(softcap=3.0, alibi_slopes=torch.rand(HQ, generator=g), attn_bias=torch.randn(NQ, NK),
                           window=(6, 0), chunk=8, sinks=torch.randn(HQ, generator=g)),
    }


def assert_close(kernel, q, k, v, *, causal, variant, mask=None):
    result = kernel(q, k, v, scale=0.3, causal=causal, attn_mask=mask, **Variant(**variant).kwargs())
    out, lse = result if isinstance(result, tuple) else (result, None)
    ref_out, ref_lse = reference(q, k, v, scale=0.3, causal=causal, attn_mask=mask, **variant)
    assert out.dtype == q.dtype and out.shape == ref_out.shape
    empty = ref_lse == -math.inf
    assert torch.equal(out[empty], torch.zeros_like(out[empty])), "a row with no visible key is not 0"
    err = (out.double() - ref_out).abs().max().item()
    assert err <= TOLERANCE[q.dtype], f"max error {err:.3g}"
    if lse is not None:
        assert torch.equal(lse[empty], ref_lse[empty].float())
        assert (lse.double() - ref_lse)[~empty].abs().max().item() <= 1e-4 * max(1.0, ref_lse.abs().max().item())


@pytest.fixture(scope="module")
def eager():
    return resolve_kernel("torch:flex", device="cpu", compile=False)


def test_spec_declares_every_variant(eager):
    spec = eager.spec
    assert spec.softcap and spec.attn_bias and spec.fp32_bias and spec.window and spec.chunk and spec.sinks
    assert spec.alibi == "symmetric" and spec.bias_order == "cap_first"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
@pytest.mark.parametrize("name", list(variants(torch.float32)))
def test_eager_flex_variant_matches_float64(eager, name, causal, dtype):
    q, k, v = inputs(dtype)
    assert_close(eager, q, k, v, causal=causal, variant=variants(dtype)[name])


def test_eager_flex_variants_with_a_boolean_mask_and_top_left(eager):
    q, k, v = inputs(torch.float32, seed=3)
    mask = torch.rand(B, 1, NQ, NK, generator=torch.Generator().manual_seed(5)) > 0.3
    assert_close(eager, q, k, v, causal="top_left", variant=variants(torch.float32)["everything"], mask=mask)


def test_eager_flex_sink_on_rows_with_no_visible_key(eager):
    """A row with no visible key gives 0 and lse = sink (-inf where the sink is -inf)."""
    q, k, v = inputs(torch.float32, n_q=NK + 3)
    sinks = torch.tensor([0.5, -math.inf, 4.0, -2.0])
    out, lse = eager(q, k, v, scale=0.3, causal="bottom_right", sinks=sinks)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    assert torch.equal(lse[:, :, :3], sinks.view(1, -1, 1).expand(B, HQ, 3))


@pytest.mark.slow
@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")),
                    reason="torch.compile builds flex's CPU kernel with a C++ compiler")
# "everything" (cap, ALiBi, a bias, window, chunk and sinks in one kernel) compiles what cap_and_bias and sinks
# would compile alone; the others add a bias that hides whole rows and per-batch ALiBi slopes.
@pytest.mark.parametrize("name", ["bias_hides", "alibi_per_batch", "everything"])
def test_compiled_flex_variant_matches_float64(name):
    kernel = resolve_kernel("torch:flex", device="cpu")
    q, k, v = inputs(torch.float16)
    assert_close(kernel, q, k, v, causal="bottom_right", variant=variants(torch.float16)[name])


def verdict(kernel, variant, *, dtype=torch.float16, causal="bottom_right", seed=3):
    """flashcheck.check's verdict on one case of ``variant`` (every property)."""
    from flashcheck import AttentionCase, check

    q, k, v = inputs(dtype, seed=seed)
    return check(kernel, AttentionCase.create(q, k, v, scale=0.3, causal=causal, variant=Variant(**variant)),
                 device="cpu")


# Each variant through the whole check once, in fp16 and bf16 by turns (the float64 comparison above takes every
# variant in every dtype).
@pytest.mark.parametrize("name, dtype", [(name, (torch.float16, torch.bfloat16)[i % 2])
                                         for i, name in enumerate(variants(torch.float32))],
                         ids=lambda x: str(x).replace("torch.float16", "fp16").replace("torch.bfloat16", "bf16"))
def test_check_passes_eager_flex_with_each_variant(eager, name, dtype):
    result = verdict(eager, variants(dtype)[name], dtype=dtype)
    assert result.status == "PASS", [f.summary() for f in result.findings]


def test_linear_alibi_is_an_option_judged_against_its_own_convention():
    """`torch:flex[alibi=linear]` adds slope (j - i), attention-gym's ALiBi, and declares it: it passes on linear
    cases, and the symmetric kernel's output is far from them (the two conventions differ where Nq != Nk)."""
    import flashcheck
    from flashcheck import AttentionCase

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 12, 16, generator=g)
    k, v = (torch.randn(1, 2, 20, 16, generator=g) for _ in range(2))
    variant = Variant(alibi_slopes=torch.tensor([0.5, 0.25]), alibi="linear")
    case = AttentionCase.create(q, k, v, scale=0.25, variant=variant)
    linear = resolve_kernel("torch:flex[compile=False,alibi=linear]", device="cpu")
    assert linear.spec.alibi == "linear" and linear.name == "torch:flex[compile=False,alibi=linear]"
    assert flashcheck.check(linear, case, device="cpu", properties=()).status == "PASS"
    symmetric = resolve_kernel("torch:flex[compile=False]", device="cpu")
    out_lin, _ = linear(q, k, v, scale=0.25, causal="none", alibi_slopes=variant.alibi_slopes)
    out_sym, _ = symmetric(q, k, v, scale=0.25, causal="none", alibi_slopes=variant.alibi_slopes)
    assert (out_lin - out_sym).abs().max() > 0.1
    with pytest.raises(flashcheck.InvalidArgument, match="alibi"):
        resolve_kernel("torch:flex[alibi=both]", device="cpu")
