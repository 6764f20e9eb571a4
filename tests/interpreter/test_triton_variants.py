"""flashcheck:triton's attention variants (soft-cap, window, chunk, sinks; ALiBi and attn_bias in
test_triton_biases.py) under the Triton interpreter: the forward judged by :func:`flashcheck.check`, the
gradients against float64 autograd of attention written here from the contract's formulas, the bits of a
variant that is another call in disguise, bad arguments, and every planted variant bug exposed (BUG from
check for the forward's, the gradients' tolerance broken for the backward's).

The gradients' one tolerance (:func:`ratio`): an element may be off by 64 units of roundoff of the input
dtype times the largest element of the reference gradient, and must be non-finite exactly where the
reference is. The correct kernel stays below it; a planted backward bug must pass it somewhere.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import pytest
import torch

import flashcheck
from flashcheck.errors import InvalidArgument
from flashcheck.features.registry import by_term
from flashcheck.judge.properties import PROPERTIES
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant
from flashcheck.kernels.triton.planted_variants import VARIANT_BACKWARD_MUTANTS, VARIANT_MUTANTS

BIASES = tuple(f.name for f in by_term("bias"))

pytestmark = pytest.mark.interpreter

F16, F32 = torch.float16, torch.float32
BLOCK = 16
D = 16
ROUNDOFF = {F16: 2.0**-11, F32: 2.0**-24}
NEG_INF = -math.inf


@functools.lru_cache(maxsize=None)
def _correct():
    return make_kernel(block_m=BLOCK, block_n=BLOCK, input_precision="ieee")


# -- the float64 reference, from the contract's formulas --------------------------------------------------


def visible(n_q, n_k, *, causal="none", attn_mask=None, window=None, chunk=None):
    """(1, 1, Nq, Nk) bool, or broadcast with ``attn_mask``: the keys each query sees, every restriction
    ANDed."""
    i = torch.arange(n_q)[:, None]
    j = torch.arange(n_k)[None, :]
    pos = i + n_k - n_q  # bottom-right alignment
    out = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal == "top_left":
        out &= j <= i
    elif causal == "bottom_right":
        out &= j <= pos
    if window is not None:
        left, right = window
        if left >= 0:
            out &= j >= pos - left
        if right >= 0:
            out &= j <= pos + right
    if chunk is not None:
        out &= torch.div(pos, chunk, rounding_mode="floor") == torch.div(j, chunk, rounding_mode="floor")
    out = out[None, None]
    return out if attn_mask is None else out & attn_mask


def biases(n_q, n_k, *, alibi_slopes=None, attn_bias=None, alibi="symmetric"):
    """ALiBi plus attn_bias in float64, broadcastable to (B, Hq, Nq, Nk), or 0.0 without either."""
    out = 0.0
    if alibi_slopes is not None:
        i = torch.arange(n_q, dtype=torch.float64)[:, None]
        j = torch.arange(n_k, dtype=torch.float64)[None, :]
        pos = -(i + n_k - n_q - j).abs() if alibi == "symmetric" else j - i
        slopes = alibi_slopes.double()
        out = slopes.view(*((1,) if slopes.dim() == 1 else ()), *slopes.shape, 1, 1) * pos
    if attn_bias is not None:
        out = out + attn_bias.double()
    return out


def reference(q, k, v, *, scale, causal="none", attn_mask=None, softcap=None, window=None, chunk=None, sinks=None,
              alibi_slopes=None, attn_bias=None, alibi="symmetric"):
    """The output in float64, differentiable in q, k, v and sinks: capped logits plus the biases (cap_first),
    -inf where hidden, the sink as one more key of value 0."""
    q, k, v = (t.double() for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = scale * q @ k.transpose(-1, -2)
    if softcap is not None and softcap != math.inf:
        s = softcap * torch.tanh(s / softcap)
    s = s + biases(q.shape[2], k.shape[2], alibi_slopes=alibi_slopes, attn_bias=attn_bias, alibi=alibi)
    seen = visible(q.shape[2], k.shape[2], causal=causal, attn_mask=attn_mask, window=window, chunk=chunk)
    s = s.masked_fill(~seen, NEG_INF)
    if sinks is not None:
        B, H, Nq, _ = s.shape
        s = torch.cat([s, sinks.double().view(1, H, 1, 1).expand(B, H, Nq, 1)], -1)
        v = torch.cat([v, v.new_zeros(B, H, 1, v.shape[-1])], 2)
    # A row of -inf only (no key, no sink) has lse = -inf and P = 0, with gradient 0, not exp(-inf + inf).
    empty = (s == NEG_INF).all(-1)
    lse = torch.logsumexp(s.masked_fill(empty[..., None], 0.0), -1).masked_fill(empty, NEG_INF)
    return torch.exp(s - lse.masked_fill(empty, 0.0)[..., None]) @ v


# -- the one tolerance ----------------------------------------------------------------------------------------


def ratio(got, want, *, u, scale: float) -> float:
    """The worst |got - want| / (64 u scale); inf where one is finite and the other not, or where they are
    unequal infinities (NaN is never equal)."""
    got, want = got.detach().double(), want.detach().double()
    same_inf = torch.isinf(want) & (got == want)
    finite = torch.isfinite(want) & torch.isfinite(got)
    if bool((~finite & ~same_inf).any()):
        return math.inf
    err = torch.where(finite, (got - want).abs(), 0.0)
    return float(err.max()) / (64 * u * scale)


# -- cases ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    n_q: int = 40
    n_k: int = 40
    heads: tuple = (2, 1)  # (Hq, Hkv): GQA throughout
    scale: float = 0.5
    causal: str = "none"
    empty_row: bool = False  # a boolean mask hiding every key from query 0
    variant: dict = field(default_factory=dict)  # softcap, window, chunk, and sinks as a list

    def tensors(self, dtype, seed=0):
        g = torch.Generator().manual_seed(seed)
        hq, hkv = self.heads
        q = torch.randn(1, hq, self.n_q, D, generator=g).to(dtype)
        k = torch.randn(1, hkv, self.n_k, D, generator=g).to(dtype)
        v = torch.randn(1, hkv, self.n_k, D, generator=g).to(dtype)
        return q, k, v

    def call(self) -> dict:
        call = dict(scale=self.scale, causal=self.causal, **self.variant)
        if "sinks" in call:
            call["sinks"] = torch.tensor(call["sinks"], dtype=F32)
        if self.empty_row:
            g = torch.Generator().manual_seed(1)
            mask = torch.rand(1, 1, self.n_q, self.n_k, generator=g) < 0.7
            mask[..., 0, :] = False
            call["attn_mask"] = mask
        return call

    def build(self, dtype) -> flashcheck.AttentionCase:
        call = self.call()
        variant = flashcheck.Variant(**{f: call.pop(f) for f in ("softcap", "window", "chunk", "sinks") if f in call})
        return flashcheck.AttentionCase.create(*self.tensors(dtype), **call, variant=variant)


CASES = {
    "softcap": Case(scale=1.0, variant=dict(softcap=2.0)),  # |logits| up to ~10: well into the cap
    "softcap_huge_logits": Case(scale=100.0, variant=dict(softcap=5.0)),
    "window": Case(n_q=40, n_k=70, variant=dict(window=(5, 3))),
    "window_unbounded_left": Case(n_q=50, n_k=35, variant=dict(window=(-1, 2))),
    "window_unbounded_right": Case(variant=dict(window=(3, -1)), causal="top_left"),
    "window_empty_rows": Case(n_q=50, n_k=20, variant=dict(window=(1, 1))),  # rows 0..28 see nothing
    "chunk_q_lt_k": Case(n_q=24, n_k=70, variant=dict(chunk=7)),
    "chunk_q_gt_k": Case(n_q=60, n_k=20, variant=dict(chunk=8)),  # positions below 0 see nothing
    "chunk_causal_mask": Case(n_q=33, n_k=45, causal="bottom_right", empty_row=True, variant=dict(chunk=6)),
    "sinks": Case(variant=dict(sinks=[0.5, 3.0])),
    "sinks_empty_rows": Case(n_q=50, n_k=20, causal="bottom_right", empty_row=True,
                             variant=dict(sinks=[1.5, NEG_INF])),
    "softcap_window_sinks": Case(n_q=45, n_k=60, scale=1.0,
                                 variant=dict(softcap=1.5, window=(9, 4), sinks=[2.0, -1.0])),
    "all": Case(n_q=40, n_k=52, scale=1.0, causal="bottom_right", empty_row=True,
                variant=dict(softcap=3.0, window=(20, 0), chunk=16, sinks=[0.0, 1.0])),
}
DTYPES = pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])


# The exact properties rerun the kernel five times or more: on a few cases, the rest judged by the budget.
WITH_PROPERTIES = {"all", "sinks_empty_rows", "window_empty_rows"}


@DTYPES
@pytest.mark.parametrize("name", sorted(CASES))
def test_check_passes_the_forward(name, dtype):
    properties = PROPERTIES if name in WITH_PROPERTIES and dtype == F16 else ()
    verdict = flashcheck.check(_correct(), CASES[name].build(dtype), device="cpu", properties=properties)
    assert verdict.ok, str(verdict)


def test_rows_with_no_key_give_zero_and_no_nan():
    case = CASES["sinks_empty_rows"]
    q, k, v = case.tensors(F32)
    out, lse = _correct()(q, k, v, **case.call())
    # bottom_right with Nq - Nk = 30: rows 0..29 see nothing (lse = sink there: test_check_passes_the_forward)
    assert torch.equal(out[:, :, :30], torch.zeros_like(out[:, :, :30]))
    assert torch.equal(lse[0, 1, :30], torch.full((30,), NEG_INF))  # a sink of -inf is no sink
    assert bool(torch.isfinite(lse[0, 0]).all())


# -- another call in disguise: the same bits ---------------------------------------------------------------


def _same_bits(a, b):
    return all(torch.equal(x.view(torch.int16 if x.dtype == F16 else torch.int32),
                           y.view(torch.int16 if y.dtype == F16 else torch.int32)) for x, y in zip(a, b))


@DTYPES
@pytest.mark.parametrize("n_q,n_k", [(40, 40), (24, 45), (45, 24)])
def test_disguised_variants_give_the_plain_calls_bits(n_q, n_k, dtype):
    case = Case(n_q=n_q, n_k=n_k, empty_row=True)
    q, k, v = case.tensors(dtype)
    call = case.call()
    kernel = _correct()
    plain = kernel(q, k, v, **call)
    assert _same_bits(kernel(q, k, v, **call, softcap=math.inf), plain)
    assert _same_bits(kernel(q, k, v, **call, sinks=torch.full((2,), NEG_INF)), plain)
    assert _same_bits(kernel(q, k, v, **call, window=(-1, -1)), plain)
    causal = dict(call, causal="bottom_right")
    assert _same_bits(kernel(q, k, v, **dict(call, window=(n_k - 1, 0))), kernel(q, k, v, **causal))
    if n_q <= n_k:  # one chunk of every key; with Nq > Nk the first rows' positions are below 0
        assert _same_bits(kernel(q, k, v, **call, chunk=n_k), plain)


# -- bad arguments -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argument,value", [
    ("softcap", 0.0), ("softcap", -1.0), ("softcap", float("nan")), ("softcap", "30"),
    ("window", (4,)), ("window", (-2, 0)), ("window", (1.5, 0)),
    ("chunk", 0), ("chunk", 2.0),
    ("sinks", torch.zeros(3)), ("sinks", torch.zeros(2, dtype=torch.int32)), ("sinks", [0.0, 0.0]),
])
def test_a_bad_variant_argument_is_named(argument, value):
    q, k, v = Case().tensors(F32)
    with pytest.raises(InvalidArgument) as raised:
        _correct()(q, k, v, scale=0.5, causal="none", **{argument: value})
    assert raised.value.argument == argument


# -- gradients -------------------------------------------------------------------------------------------------


def gradients(kernel, case: Case, dtype, seed=0):
    """(got, want): the kernel's gradients of q, k, v (and the sinks when the case has them) for a random
    dO, and float64 autograd's."""
    q, k, v = case.tensors(dtype, seed)
    call = case.call()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if "sinks" in call:
        leaves.append(call.pop("sinks").requires_grad_())
    sinks = dict(sinks=leaves[3]) if len(leaves) == 4 else {}
    out, _ = kernel(*leaves[:3], **call, **sinks)
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7)).to(dtype)
    got = torch.autograd.grad(out, leaves, do)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    want_out = reference(*exact[:3], **call, **(dict(sinks=exact[3]) if sinks else {}))
    return got, torch.autograd.grad(want_out, exact, do.double())


def backward_ratio(got, want, dtype) -> float:
    """The worst :func:`ratio` of the gradients, each scaled by its largest reference element (the sinks' too
    in the input dtype's roundoff: they come from D = dO . O of the rounded O)."""
    return max(ratio(g, w, u=ROUNDOFF[dtype], scale=float(w.abs().max()) or 1.0) for g, w in zip(got, want))


@DTYPES
@pytest.mark.parametrize("name", ["softcap", "window", "window_empty_rows", "chunk_q_lt_k", "chunk_q_gt_k", "sinks",
                                  "sinks_empty_rows", "softcap_window_sinks", "all"])
def test_gradients_match_float64_autograd(name, dtype):
    got, want = gradients(_correct(), CASES[name], dtype)
    assert got[0].dtype == dtype and len(got) == (4 if "sinks" in CASES[name].variant else 3)
    assert backward_ratio(got, want, dtype) <= 1.0


def test_gradients_repeat_bit_for_bit():
    case = CASES["softcap_window_sinks"]
    first, _ = gradients(_correct(), case, F16)
    second, _ = gradients(_correct(), case, F16)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


# -- the planted variant bugs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    case: Case
    dtype: torch.dtype = F32


PROBES = {
    "softcap_before_scale": Probe(Case(variant=dict(softcap=2.0))),
    "softcap_after_masking": Probe(Case(causal="top_left", variant=dict(softcap=1.0))),
    "softcap_divides_back": Probe(Case(variant=dict(softcap=2.0)), F16),
    "softcap_in_base_2": Probe(Case(variant=dict(softcap=2.0))),
    "window_left_edge_short": Probe(Case(variant=dict(window=(4, 0)))),
    "window_right_edge_past": Probe(Case(variant=dict(window=(4, 2))), F16),
    "window_top_left": Probe(Case(n_q=24, n_k=40, variant=dict(window=(4, 2)))),
    "window_unbounded_side_literal": Probe(Case(variant=dict(window=(-1, 2)))),
    "window_skip_off_by_one": Probe(Case(n_q=2 * BLOCK + 1, n_k=2 * BLOCK + 1, variant=dict(window=(5, 0)))),
    "chunk_top_left": Probe(Case(n_q=24, n_k=40, variant=dict(chunk=6))),
    "chunk_end_inclusive": Probe(Case(variant=dict(chunk=8)), F16),
    "chunk_negative_positions_in_first_chunk": Probe(Case(n_q=50, n_k=20, variant=dict(chunk=8))),
    "sink_ignored": Probe(Case(variant=dict(sinks=[0.5, 2.0]))),
    "sink_in_base_2": Probe(Case(variant=dict(sinks=[2.0, -1.5])), F16),
    "sink_max_not_updated": Probe(Case(empty_row=True, variant=dict(sinks=[4.0, -1.0]))),
    "sink_empty_row_nan": Probe(Case(empty_row=True, variant=dict(sinks=[NEG_INF, 1.0]))),
    "softcap_derivative_missing": Probe(Case(variant=dict(softcap=1.0))),
    "softcap_missing_in_recomputation": Probe(Case(variant=dict(softcap=1.0)), F16),
    "window_missing_backward": Probe(Case(variant=dict(window=(4, 2)))),
    "chunk_top_left_backward": Probe(Case(n_q=24, n_k=40, variant=dict(chunk=6))),
    "window_left_edge_short_backward": Probe(Case(variant=dict(window=(4, 0)))),
    "chunk_end_inclusive_backward": Probe(Case(variant=dict(chunk=8))),
    "dsinks_sign_flipped": Probe(Case(variant=dict(sinks=[0.5, 2.0]))),
    "dsinks_in_base_2": Probe(Case(variant=dict(sinks=[0.5, 2.0])), F16),
}


def test_every_variant_mutant_has_a_probe_and_every_feature_its_bugs():
    # The biases' planted bugs have probes of their own (test_triton_biases.py).
    mutants = tuple(m for m in VARIANT_MUTANTS + VARIANT_BACKWARD_MUTANTS if m.area not in BIASES)
    assert sorted(PROBES) == sorted(m.name for m in mutants)
    for feature in ("softcap", "window", "chunk", "sinks"):
        assert sum(m.area == feature for m in VARIANT_MUTANTS) >= 2, feature
        assert sum(m.area == feature for m in VARIANT_BACKWARD_MUTANTS) >= 2, feature
    assert all(m.target == "forward" for m in VARIANT_MUTANTS)
    assert all(m.target == "backward" and m.description and m.exposed_by for m in VARIANT_BACKWARD_MUTANTS)


def _mutant(name):
    bad = load_mutant(name, block_m=BLOCK, block_n=BLOCK, input_precision="ieee")
    assert bad.spec == _correct().spec and f"~{name}" in bad.name
    return bad


@pytest.mark.parametrize("mutant", [m for m in VARIANT_MUTANTS if m.area not in BIASES], ids=lambda m: m.name)
def test_check_flags_each_forward_variant_mutant_where_the_correct_kernel_passes(mutant):
    probe = PROBES[mutant.name]
    case = probe.case.build(probe.dtype)
    good = flashcheck.check(_correct(), case, device="cpu", properties=())
    assert good.ok, str(good)
    bad = flashcheck.check(_mutant(mutant.name), case, device="cpu", properties=())
    assert bad.status == "BUG", str(bad)


@pytest.mark.parametrize("mutant", [m for m in VARIANT_BACKWARD_MUTANTS if m.area not in BIASES], ids=lambda m: m.name)
def test_each_backward_variant_mutant_breaks_the_tolerance_the_correct_kernel_keeps(mutant):
    probe = PROBES[mutant.name]
    assert backward_ratio(*gradients(_correct(), probe.case, probe.dtype), probe.dtype) <= 1.0
    assert backward_ratio(*gradients(_mutant(mutant.name), probe.case, probe.dtype), probe.dtype) > 1.0
