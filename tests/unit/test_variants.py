"""The variant contract: soft-cap, window, chunk and sinks, from the case to the kernel's keywords, the
saved file, the oracle's semantics and the property that holds each declared feature at its neutral value."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase, InvalidArgument, Variant
from flashcheck.contract import masks
from flashcheck.features.chunk import chunked
from flashcheck.features.window import window as window_mask
from flashcheck.numerics.oracle import reference_attention


def _qkv(b=1, hq=2, hkv=1, nq=9, nk=13, d=16, seed=0, dtype=torch.float16):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(b, h, n, d, generator=gen).to(dtype) for h, n in ((hq, nq), (hkv, nk), (hkv, nk)))


@pytest.mark.parametrize("kwargs,argument", [
    (dict(softcap=0.0), "softcap"), (dict(softcap=-1.0), "softcap"), (dict(softcap=True), "softcap"),
    (dict(window=(3,)), "window"), (dict(window=(-2, 0)), "window"), (dict(window=(1.5, 0)), "window"),
    (dict(chunk=0), "chunk"), (dict(sinks=torch.tensor([math.nan])), "sinks"),
    (dict(sinks=torch.tensor([math.inf])), "sinks"), (dict(sinks=torch.zeros(2, 2)), "sinks"),
])
def test_bad_variants_are_refused_by_name(kwargs, argument):
    with pytest.raises(InvalidArgument, match=argument) as info:
        Variant(**kwargs)
    assert "Pass" in str(info.value)


@pytest.mark.parametrize("n_q,n_k", [(5, 9), (9, 5), (7, 7)])
@pytest.mark.parametrize("window", [(2, 0), (0, 0), (-1, 1), (3, -1), (1, 2)])
def test_the_window_is_the_bottom_right_band(n_q, n_k, window):
    left, right = window
    vis = masks.materialize(window_mask(left, right, n_q=n_q, n_k=n_k), (1, 1, n_q, n_k))[0, 0]
    for i in range(n_q):
        for j in range(n_k):
            centre = i + n_k - n_q
            want = (left < 0 or j >= centre - left) and (right < 0 or j <= centre + right)
            assert bool(vis[i, j]) == want


@pytest.mark.parametrize("n_q,n_k,size", [(5, 9, 4), (9, 5, 3), (8, 8, 1)])
def test_a_chunk_is_the_query_s_block_of_positions(n_q, n_k, size):
    vis = masks.materialize(chunked(size, n_q=n_q, n_k=n_k), (1, 1, n_q, n_k))[0, 0]
    for i in range(n_q):
        for j in range(n_k):
            assert bool(vis[i, j]) == ((i + n_k - n_q) // size == j // size)


def test_a_case_with_a_variant_saves_and_loads_bit_for_bit(tmp_path):
    q, k, v = _qkv()
    variant = Variant(softcap=30.0, window=(4, -1), chunk=8, sinks=torch.tensor([0.1, -math.inf]))
    case = AttentionCase.create(q, k, v, scale=0.3, causal="bottom_right", variant=variant)
    _, json_path = case.save(tmp_path / "c")
    loaded = AttentionCase.load(json_path)
    assert loaded.equal_bits(case) and loaded.variant.describe() == variant.describe()
    assert not loaded.equal_bits(AttentionCase.create(q, k, v, scale=0.3, causal="bottom_right"))
    plain = AttentionCase.create(q, k, v, scale=0.3)
    plain.save(tmp_path / "p")
    assert '"format_version": 1' in (tmp_path / "p.json").read_text()  # a plain case stays readable as before


def test_a_finite_sink_gives_an_empty_row_zero_output_and_the_sink_as_lse():
    q, k, v = _qkv(nq=4, nk=2)
    sinks = torch.tensor([1.5, -math.inf])
    ref = reference_attention(q, k, v, scale=0.25, causal="bottom_right", variant=Variant(sinks=sinks))
    # Nq > Nk bottom-right: query 0 and 1 see no key; head 0 has a sink, head 1 none.
    assert ref.out[0, 0, :2].eq(0).all() and ref.lse[0, 0, :2].eq(1.5).all()
    assert ref.empty_rows[0, 1, :2].all() and not ref.empty_rows[0, 0].any()
    case = AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right", variant=Variant(sinks=sinks))
    assert torch.equal(case.empty_rows(), ref.empty_rows)


def _plain(q, k, v, *, scale, causal, attn_mask=None, softcap=None, window=None, sinks=None):
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=scale).to(q.dtype)


def test_a_feature_the_spec_does_not_declare_is_refused():
    q, k, v = _qkv(hkv=2)
    case = AttentionCase.create(q, k, v, scale=0.25, variant=Variant(softcap=5.0))
    with pytest.raises(InvalidArgument, match="softcap=True"):
        flashcheck.check(flashcheck.kernel(_plain, precision="upcast"), case, device="cpu")


def _cap_inf_breaks(q, k, v, *, scale, causal, attn_mask=None, softcap=None):
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if softcap is not None:  # inf * tanh(s / inf) = inf * 0: NaN, where a cap of inf must be no cap
        s = softcap * torch.tanh(s / softcap)
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype)


def test_a_declared_feature_at_its_neutral_value_must_change_nothing():
    q, k, v = _qkv(hkv=2)
    case = AttentionCase.create(q, k, v, scale=0.25)
    kernel = flashcheck.kernel(_cap_inf_breaks, precision="upcast", softcap=True)
    verdict = flashcheck.check(kernel, case, device="cpu")
    assert verdict.status == "BUG" and "neutral" in verdict.properties
    assert any(f.kind == "neutral_variant" and "softcap=inf" in f.diagnosis for f in verdict.findings), str(verdict)
    fine = flashcheck.check(flashcheck.kernel(_plain, precision="upcast"), case, device="cpu")
    assert "neutral" not in fine.properties  # nothing declared, nothing to judge
