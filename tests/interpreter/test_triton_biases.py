"""flashcheck:triton's biases (ALiBi and attn_bias) under the Triton interpreter: the forward and the gradients
against float64 attention written from the contract's formulas (test_triton_variants.reference), within that
file's one tolerance (:func:`ratio`); the bits of a bias that is another call in disguise, bad arguments, the
linear ALiBi option, and every planted bias bug exposed (the tolerance broken where the correct kernel keeps
it; and by :func:`flashcheck.check` and :func:`flashcheck.check_backward` on one case of both biases).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant
from flashcheck.kernels.triton.planted_variants import VARIANT_BACKWARD_MUTANTS, VARIANT_MUTANTS

from .test_triton_variants import BLOCK, F16, F32, NEG_INF, ROUNDOFF, D, backward_ratio, ratio, reference

pytestmark = pytest.mark.interpreter

DTYPES = pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
BIAS_AREAS = ("alibi_slopes", "attn_bias")


@functools.lru_cache(maxsize=None)
def _kernel(alibi="symmetric"):
    return make_kernel(block_m=BLOCK, block_n=BLOCK, input_precision="ieee", alibi=alibi)


@dataclass(frozen=True)
class BiasCase:
    n_q: int = 40
    n_k: int = 40
    batch: int = 2
    heads: tuple = (2, 1)  # (Hq, Hkv): GQA throughout
    scale: float = 0.5
    causal: str = "none"
    slopes: tuple | None = None  # (Hq,) or (B, Hq), as nested tuples
    bias: tuple | None = None  # attn_bias's shape, broadcastable to (B, Hq, Nq, Nk)
    hide: float = 0.0  # the share of attn_bias's entries that are -inf
    empty_row: bool = False  # attn_bias hides every key of its first row (of every row where Nq broadcasts)
    fp32_bias: bool = False  # an fp32 bias whatever the inputs' dtype
    alibi: str = "symmetric"
    more: dict = field(default_factory=dict)  # softcap, window, ... as the kernel takes them

    def inputs(self, dtype, seed=0):
        """(q, k, v, the kernel's keywords)."""
        g = torch.Generator().manual_seed(seed)
        hq, hkv = self.heads
        q = torch.randn(self.batch, hq, self.n_q, D, generator=g).to(dtype)
        k = torch.randn(self.batch, hkv, self.n_k, D, generator=g).to(dtype)
        v = torch.randn(self.batch, hkv, self.n_k, D, generator=g).to(dtype)
        call = dict(scale=self.scale, causal=self.causal, **self.more)
        if self.slopes is not None:
            call["alibi_slopes"] = torch.tensor(self.slopes, dtype=F32)
        if self.bias is not None:
            bias = 2 * torch.randn(self.bias, generator=g)
            bias = bias.masked_fill(torch.rand(self.bias, generator=g) < self.hide, NEG_INF)
            if self.empty_row:
                bias.view(-1, self.bias[-1])[0] = NEG_INF
            call["attn_bias"] = bias.to(F32 if self.fp32_bias else dtype)
        return q, k, v, call

    def want(self, q, k, v, call):
        return reference(q, k, v, **call, alibi=self.alibi)


CASES = {
    "alibi": BiasCase(slopes=(0.25, 1.0)),
    "alibi_per_batch_q_lt_k": BiasCase(n_q=24, n_k=50, slopes=((0.1, 0.5), (1.0, 0.3))),
    "alibi_q_gt_k_causal": BiasCase(n_q=50, n_k=20, causal="bottom_right", slopes=(0.5, 0.2)),  # rows 0..29 empty
    "alibi_linear": BiasCase(n_q=24, n_k=40, slopes=(0.25, -0.5), alibi="linear"),
    "bias_heads": BiasCase(bias=(1, 2, 1, 40)),
    "bias_rows": BiasCase(bias=(2, 1, 40, 40)),
    "bias_hidden_empty_row": BiasCase(n_q=33, n_k=45, bias=(2, 1, 33, 45), hide=0.3, empty_row=True),
    "bias_2d_fp32": BiasCase(n_q=24, n_k=40, bias=(24, 40), fp32_bias=True),
    "alibi_bias_softcap": BiasCase(n_q=45, n_k=60, scale=1.0, slopes=(0.3, 0.1), bias=(2, 2, 45, 60), hide=0.2,
                                   more=dict(softcap=2.0)),
    "alibi_bias_window_causal": BiasCase(n_q=40, n_k=52, causal="bottom_right", slopes=((0.2, 0.4), (0.6, 0.1)),
                                         bias=(1, 2, 40, 1), empty_row=True, more=dict(softcap=3.0, window=(20, 0))),
}


def forward_ratio(kernel, case: BiasCase, dtype) -> float:
    q, k, v, call = case.inputs(dtype)
    out, _ = kernel(q, k, v, **call)
    want = case.want(q, k, v, call)
    return ratio(out, want, u=ROUNDOFF[dtype], scale=float(want.abs().max()) or 1.0)


@DTYPES
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_forward_matches_float64(name, dtype):
    case = CASES[name]
    assert forward_ratio(_kernel(case.alibi), case, dtype) <= 1.0


def test_a_row_the_bias_hides_entirely_gives_zero_and_lse_minus_inf():
    case = CASES["bias_hidden_empty_row"]
    q, k, v, call = case.inputs(F32)
    out, lse = _kernel()(q, k, v, **call)
    assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0]))  # the bias's row 0 of batch 0, every head
    assert bool((lse[0, :, 0] == NEG_INF).all()) and bool(torch.isfinite(lse[1]).all())


def _same_bits(a, b):
    return all(torch.equal(x.view(torch.int16 if x.dtype == F16 else torch.int32),
                           y.view(torch.int16 if y.dtype == F16 else torch.int32)) for x, y in zip(a, b))


@DTYPES
def test_zero_biases_and_a_bias_of_minus_inf_are_the_plain_and_masked_calls(dtype):
    case = BiasCase(n_q=24, n_k=45)
    q, k, v, call = case.inputs(dtype)
    kernel = _kernel()
    plain = kernel(q, k, v, **call)
    zeros = dict(alibi_slopes=torch.zeros(2), attn_bias=torch.zeros(1, dtype=dtype))
    assert _same_bits(kernel(q, k, v, **call, **zeros), plain)
    mask = torch.rand(2, 1, 24, 45, generator=torch.Generator().manual_seed(3)) < 0.6
    mask[0, 0, 5] = False
    bias = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, NEG_INF)
    assert _same_bits(kernel(q, k, v, **call, attn_bias=bias), kernel(q, k, v, **call, attn_mask=mask))


@pytest.mark.parametrize("argument,value", [
    ("alibi_slopes", torch.zeros(3)), ("alibi_slopes", torch.zeros(2, 2, 1)),
    ("alibi_slopes", torch.zeros(2, dtype=torch.int32)), ("alibi_slopes", [0.5, 0.5]),
    ("attn_bias", torch.zeros(3, 40)), ("attn_bias", torch.zeros(40, dtype=torch.float16)),
    ("attn_bias", torch.zeros(1, 1, 1, 1, 40)), ("attn_bias", 0.0),
])
def test_a_bad_bias_argument_is_named(argument, value):
    q, k, v, call = BiasCase().inputs(F32)
    with pytest.raises(InvalidArgument) as raised:
        _kernel()(q, k, v, **call, **{argument: value})
    assert raised.value.argument == argument


def test_the_alibi_mode_is_an_option_the_name_and_spec_carry():
    linear = resolve_kernel("flashcheck:triton[block_m=16,block_n=16,alibi=linear]", device="cpu")
    assert linear.spec.alibi == "linear" and "alibi=linear" in linear.name
    default = resolve_kernel("flashcheck:triton[block_m=16,block_n=16]", device="cpu")
    assert default.spec.alibi == "symmetric" and "alibi" not in default.name
    assert default.spec.attn_bias and default.spec.fp32_bias and default.spec.bias_order == "cap_first"
    with pytest.raises(InvalidArgument) as raised:
        make_kernel(alibi="asymmetric")
    assert raised.value.argument == "alibi"


# -- gradients -------------------------------------------------------------------------------------------------


def gradients(kernel, case: BiasCase, dtype, seed=0):
    """(got, want): the kernel's dQ, dK, dV for a random dO, and float64 autograd's."""
    q, k, v, call = case.inputs(dtype, seed)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, _ = kernel(*leaves, **call)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7)).to(dtype)
    got = torch.autograd.grad(out, leaves, do)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    return got, torch.autograd.grad(case.want(*exact, call), exact, do.double())


@DTYPES
@pytest.mark.parametrize("name", ["alibi", "alibi_per_batch_q_lt_k", "alibi_q_gt_k_causal", "alibi_linear",
                                  "bias_rows", "bias_hidden_empty_row", "bias_2d_fp32", "alibi_bias_softcap",
                                  "alibi_bias_window_causal"])
def test_gradients_match_float64_autograd(name, dtype):
    case = CASES[name]
    got, want = gradients(_kernel(case.alibi), case, dtype)
    assert [g.dtype for g in got] == [dtype] * 3
    assert backward_ratio(got, want, dtype) <= 1.0


@DTYPES
@pytest.mark.parametrize("name", ["bias_heads", "bias_hidden_empty_row", "bias_2d_fp32", "alibi_bias_softcap",
                                  "alibi_bias_window_causal"])
def test_the_bias_gradient_matches_float64_autograd(name, dtype):
    """dBias: dS of the biased logits, summed over the bias's broadcast dims, in its shape and dtype."""
    case = CASES[name]
    q, k, v, call = case.inputs(dtype)
    bias = call.pop("attn_bias")
    leaves = [t.clone().requires_grad_() for t in (q, k, v, bias)]
    out, _ = _kernel()(*leaves[:3], **call, attn_bias=leaves[3])
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(dtype)
    got = torch.autograd.grad(out, leaves, do)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    want = torch.autograd.grad(case.want(*exact[:3], dict(call, attn_bias=exact[3])), exact, do.double())
    assert got[3].shape == bias.shape and got[3].dtype == bias.dtype
    assert backward_ratio(got[:3], want[:3], dtype) <= 1.0
    # dBias sums dS over the broadcast dims, which cancels (to 0 along a row): scaled by the sum of |dS|.
    full = exact[3].detach().expand(out.shape[:-1] + (k.shape[2],)).clone().requires_grad_()
    ds = torch.autograd.grad(case.want(*exact[:3], dict(call, attn_bias=full)), full, do.double())[0]
    assert ratio(got[3], want[3], u=ROUNDOFF[dtype], scale=float(ds.abs().sum_to_size(bias.shape).max())) <= 1.0


def test_the_slopes_get_no_gradient():
    q, k, v, call = CASES["alibi"].inputs(F32)
    slopes = call.pop("alibi_slopes").requires_grad_()
    q.requires_grad_()
    out, _ = _kernel()(q, k, v, **call, alibi_slopes=slopes)
    out.sum().backward()
    assert q.grad is not None and slopes.grad is None

# -- the planted bias bugs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    case: BiasCase
    dtype: torch.dtype = F32


_SOFTCAP_BIAS = BiasCase(scale=1.0, bias=(1, 2, 40, 40), more=dict(softcap=2.0))
PROBES = {
    "alibi_slopes_of_kv_head": Probe(BiasCase(slopes=(0.25, 1.0))),
    "alibi_top_left": Probe(BiasCase(n_q=24, n_k=40, slopes=(0.25, 1.0)), F16),
    "alibi_distance_off_by_one": Probe(BiasCase(slopes=(0.25, 1.0))),
    "alibi_in_base_e": Probe(BiasCase(slopes=(0.25, 1.0)), F16),
    "bias_times_scale": Probe(BiasCase(bias=(2, 2, 40, 40))),
    "bias_before_cap": Probe(_SOFTCAP_BIAS),
    "bias_batch_stride_ignored": Probe(BiasCase(bias=(2, 1, 40, 40)), F16),
    "bias_transposed": Probe(BiasCase(bias=(1, 2, 1, 40))),
    "bias_finite_sentinel": Probe(CASES["bias_hidden_empty_row"]),
    "alibi_missing_backward": Probe(BiasCase(slopes=(0.25, 1.0))),
    "alibi_slopes_of_kv_head_backward": Probe(BiasCase(slopes=(0.25, 1.0)), F16),
    "alibi_top_left_backward": Probe(BiasCase(n_q=24, n_k=40, slopes=(0.25, 1.0))),
    "bias_missing_backward": Probe(BiasCase(bias=(2, 2, 40, 40)), F16),
    "bias_before_cap_backward": Probe(_SOFTCAP_BIAS),
    "bias_batch_stride_ignored_backward": Probe(BiasCase(bias=(2, 1, 40, 40))),
}
_FORWARD = [m for m in VARIANT_MUTANTS if m.area in BIAS_AREAS]
_BACKWARD = [m for m in VARIANT_BACKWARD_MUTANTS if m.area in BIAS_AREAS]


def test_every_bias_mutant_has_a_probe_and_each_bias_its_bugs():
    assert sorted(PROBES) == sorted(m.name for m in _FORWARD + _BACKWARD)
    for area in BIAS_AREAS:
        assert sum(m.area == area for m in _FORWARD) >= 2 and sum(m.area == area for m in _BACKWARD) >= 2, area


def _mutant(name):
    bad = load_mutant(name, block_m=BLOCK, block_n=BLOCK, input_precision="ieee")
    assert bad.spec == _kernel().spec and f"~{name}" in bad.name
    return bad


@pytest.mark.parametrize("mutant", _FORWARD, ids=lambda m: m.name)
def test_each_forward_bias_mutant_breaks_the_tolerance_the_correct_kernel_keeps(mutant):
    probe = PROBES[mutant.name]
    assert forward_ratio(_kernel(), probe.case, probe.dtype) <= 1.0
    assert forward_ratio(_mutant(mutant.name), probe.case, probe.dtype) > 1.0


@pytest.mark.parametrize("mutant", _BACKWARD, ids=lambda m: m.name)
def test_each_backward_bias_mutant_breaks_the_tolerance_the_correct_kernel_keeps(mutant):
    probe = PROBES[mutant.name]
    assert backward_ratio(*gradients(_kernel(), probe.case, probe.dtype), probe.dtype) <= 1.0
    assert backward_ratio(*gradients(_mutant(mutant.name), probe.case, probe.dtype), probe.dtype) > 1.0


def test_check_and_check_backward_pass_the_correct_kernel_and_flag_a_planted_bug_of_each_bias():
    case = BiasCase(n_q=24, n_k=40, slopes=(0.25, 1.0), bias=(2, 1, 24, 40), hide=0.1, empty_row=True,
                    more=dict(softcap=3.0))
    q, k, v, call = case.inputs(F16)
    variant = flashcheck.Variant(**{f: call.pop(f) for f in ("softcap", "alibi_slopes", "attn_bias")})
    built = flashcheck.AttentionCase.create(q, k, v, **call, variant=variant)
    good = flashcheck.check(_kernel(), built, device="cpu", properties=())
    assert good.status == "PASS", str(good)
    for name in ("alibi_top_left", "bias_batch_stride_ignored"):
        bad = flashcheck.check(_mutant(name), built, device="cpu", properties=())
        assert bad.status == "BUG", (name, str(bad))
    good = flashcheck.check_backward(_kernel(), built, device="cpu")  # dBias judged beside dQ, dK, dV
    assert good.status == "PASS" and "dbias" in str(good), str(good)
    for name in ("alibi_missing_backward", "bias_missing_backward"):
        bad = flashcheck.check_backward(_mutant(name), built, device="cpu")
        assert bad.status == "BUG", (name, str(bad))


def test_biases_added_one_by_one_to_base_2_logits_are_a_legal_order_not_an_outlier():
    """The H200 self-test's one SUSPICIOUS on the correct kernel (2026-12-02, fp16 case 25, cut to its worst
    head): every key's attn_bias is -60000 and its ALiBi spread 0.01. flashcheck:triton adds ALiBi, then the
    bias, to base-2 logits near -86562, where fp32's spacing is 2^-7: the rounding keeps part of the ALiBi
    spread, P rounds coherently to fp16, and the output is one fp16 step (0.25 of the budget) off an exact
    1368. A twin that adds the summed biases to natural logits rounds the spread away and lands exact, so the
    error looked 2e11 times the worst legal order. The envelope now includes exp2 kernels' order."""
    import os

    from flashcheck.inputs.case import load_case
    from flashcheck.judge.check import check
    from flashcheck.kernels.registry import resolve_kernel

    case = load_case(os.path.join(os.path.dirname(__file__), "cases", "base2_bias_rounding.json"))
    verdict = check(resolve_kernel("flashcheck:triton[block_m=32,block_n=32]", device="cpu"), case, device="cpu")
    assert verdict.status == "PASS" and 0.2 < verdict.max_ratio < 0.3, verdict


def test_poisoning_a_per_head_bias_on_stride_0_heads_keeps_the_heads_equal():
    """The H200 self-test of 2026-12-02 ended its workers on this: a key hidden in both heads, by the mask in
    one and by a -inf bias in the other, of K and V stored as one head viewed twice (layout "expanded"). The
    NaN poison of keys a mask hides took them head by head, which stride-0 heads cannot hold; it now takes
    the keys so hidden in every head."""
    import flashcheck
    from flashcheck import AttentionCase
    from flashcheck.judge.check import check
    from flashcheck.kernels.registry import resolve_kernel

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 8, 16, generator=g).half()
    k, v = (torch.randn(1, 1, 12, 16, generator=g).half().expand(1, 2, 12, 16).contiguous() for _ in range(2))
    mask = torch.ones(1, 2, 8, 12, dtype=torch.bool)
    mask[..., 10:] = False
    mask[0, 1, :, 9] = False  # the mask hides keys 10 and 11, and key 9 in head 1 ...
    bias = torch.zeros(1, 2, 1, 12)
    bias[0, 0, 0, 9] = -math.inf  # ... which the bias hides in head 0: hidden in both heads, masked in one
    case = AttentionCase.create(q, k, v, scale=0.25, attn_mask=mask, layout="expanded",
                                variant=flashcheck.Variant(attn_bias=bias))
    verdict = check(resolve_kernel("flashcheck:triton", device="cpu"), case, device="cpu", properties=["poison"])
    assert verdict.status == "PASS" and "poison" in verdict.properties, verdict
