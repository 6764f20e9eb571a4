"""Every refusal of validation.check_attention_inputs: an InvalidArgument naming the argument, echoing
its value and saying how to fix it; and the inputs it must accept."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashcheck.contract.validation import Shapes, check_attention_inputs
from flashcheck.errors import InvalidArgument, describe

B, HQ, HKV, NQ, NK, D, DV = 2, 4, 2, 5, 7, 8, 6


def qkv(dtype=torch.float16, **shapes):
    """Valid inputs; ``q=(...)`` etc. override one tensor's shape."""
    q = torch.zeros(shapes.get("q", (B, HQ, NQ, D)), dtype=dtype)
    k = torch.zeros(shapes.get("k", (B, HKV, NK, D)), dtype=dtype)
    v = torch.zeros(shapes.get("v", (B, HKV, NK, DV)), dtype=dtype)
    return q, k, v


_VALID = object()  # "use the valid default": None itself is a bad value to test


def call(q=_VALID, k=_VALID, v=_VALID, *, scale=0.5, causal="none", attn_mask=None):
    dq, dk, dv = qkv()
    return check_attention_inputs(dq if q is _VALID else q, dk if k is _VALID else k, dv if v is _VALID else v,
                                  scale=scale, causal=causal, attn_mask=attn_mask)


def refused(name, value, problem, **kwargs):
    """Call with ``kwargs``; check the error names ``name``, echoes ``value`` and carries a fix."""
    with pytest.raises(InvalidArgument) as info:
        call(**kwargs)
    err = info.value
    message = str(err)
    assert err.argument == name
    assert message.startswith(f"{name}={describe(value)}: "), message
    assert describe(err.value) == describe(value)
    assert problem in err.problem, message
    assert err.fix and message.endswith(err.fix), message
    return err


# ---- q, k, v -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [[[1.0]], 3.0, "q", None])
def test_not_a_tensor(name, bad):
    refused(name, bad, "expected a torch.Tensor", **{name: bad})


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("shape", [(NQ, D), (HQ, NQ, D), (1, B, HQ, NQ, D)])
def test_wrong_rank(name, shape):
    bad = torch.zeros(shape, dtype=torch.float16)
    err = refused(name, bad, f"expected 4 dimensions (B, H, N, D), got {len(shape)}", **{name: bad})
    assert "Reshape" in err.fix


@pytest.mark.parametrize("name", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64, torch.bool, torch.uint8])
def test_unsupported_dtype(name, dtype):
    # Every tensor has the bad dtype, so the dtype check (not the mixed-dtype one) is what fires.
    q, k, v = qkv(dtype=dtype)
    with pytest.raises(InvalidArgument) as info:
        check_attention_inputs(q, k, v, scale=1.0, causal="none")
    err = info.value
    assert err.argument == "q.dtype" and err.value == dtype
    assert str(err).startswith(f"q.dtype={dtype!r}: flashcheck tests float16, bfloat16, float32 and fp8")
    assert "Use one of ['fp16', 'bf16', 'fp32', 'fp8_e4m3', 'fp8_e5m2']" in err.fix
    # And each tensor is checked by its own name.
    bad = torch.zeros(dict(zip("qkv", qkv()))[name].shape, dtype=dtype)
    with pytest.raises(InvalidArgument, match=rf"^{name}\.dtype={dtype!r}: flashcheck tests"):
        call(**{name: bad})


@pytest.mark.parametrize("name,shape", [("q", (B, HQ, 0, D)), ("k", (B, HKV, 0, D)), ("v", (B, HKV, NK, 0)),
                                        ("q", (0, HQ, NQ, D))])
def test_empty_dimension(name, shape):
    bad = torch.zeros(shape, dtype=torch.float16)
    refused(name, bad, "empty dimension", **{name: bad})


@pytest.mark.parametrize("odd", ["q", "k", "v"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mixed_dtypes(odd, dtype):
    tensors = dict(zip("qkv", qkv()))
    tensors[odd] = tensors[odd].to(dtype)
    with pytest.raises(InvalidArgument) as info:
        call(**tensors)
    err = info.value
    assert err.argument in ("q", "k", "v")
    assert str(err).startswith(f"{err.argument}={describe(err.value)}: dtypes differ: q ")
    for t in tensors.values():
        assert str(t.dtype) in err.problem
    assert err.fix == "Cast q, k and v to one dtype."


def test_mixed_dtypes_names_the_odd_tensor():
    q, k, v = qkv()
    with pytest.raises(InvalidArgument, match=r"^v="):
        call(q, k, v.float())


def test_mixed_devices_on_the_meta_device():
    # The meta device stands in for a second device, so this needs no GPU.
    q, k, v = qkv()
    meta_k = k.to("meta")
    err = refused("k", meta_k, "devices differ", k=meta_k)
    assert "meta" in err.problem and "cpu" in err.problem and err.fix == "Move q, k and v to one device."


def test_batch_mismatch():
    q, k, v = qkv(k=(B + 1, HKV, NK, D), v=(B + 1, HKV, NK, DV))
    err = refused("k", k, f"batch size differs from q's ({B})", k=k, v=v)
    assert "same batch size" in err.fix


def test_batch_mismatch_of_v_names_v():
    q, k, v = qkv(v=(B + 1, HKV, NK, DV))
    with pytest.raises(InvalidArgument, match=r"^v="):
        call(q, k, v)


@pytest.mark.parametrize("vshape", [(B, HKV + 1, NK, DV), (B, HKV, NK + 1, DV), (B, 1, NK - 1, DV)])
def test_k_v_heads_or_lengths_differ(vshape):
    bad = torch.zeros(vshape, dtype=torch.float16)
    err = refused("v", bad, f"k is {(B, HKV, NK, D)}: heads and length must match k's", v=bad)
    assert "same number of heads and keys" in err.fix


def test_head_dim_mismatch():
    bad = torch.zeros(B, HKV, NK, D + 1, dtype=torch.float16)
    refused("k", bad, f"head dim {D + 1} differs from q's {D}", k=bad)


@pytest.mark.parametrize("hkv", [3, 5, 8])
def test_gqa_not_a_multiple(hkv):
    k = torch.zeros(B, hkv, NK, D, dtype=torch.float16)
    v = torch.zeros(B, hkv, NK, DV, dtype=torch.float16)
    err = refused("k", k, f"q has {HQ} heads, not a multiple of k's {hkv}", k=k, v=v)
    assert "multiple of key heads" in err.fix


# ---- scale and causal -------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf, np.float32("nan"), np.float64("inf")])
def test_scale_not_finite(scale):
    refused("scale", scale, "the softmax scale must be finite", scale=scale)


@pytest.mark.parametrize("scale", [True, False, "0.125", None, 1j, torch.tensor(0.5), [0.5], np.bool_(True)])
def test_scale_not_a_real_number(scale):
    err = refused("scale", scale, "expected a real number", scale=scale)
    assert "1 / sqrt(D)" in err.fix


@pytest.mark.parametrize("causal", [True, "causal", "bottom-right", "TOP_LEFT", 1, 0, "", np.str_("left")])
def test_bad_causal(causal):
    err = refused("causal", causal, "unknown causal alignment", causal=causal)
    assert "['none', 'top_left', 'bottom_right']" in err.fix
    assert ("ambiguous" in err.fix) == (causal is True)


# ---- attn_mask ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.uint8, torch.int64])
def test_mask_not_bool(dtype):
    bad = torch.ones(1, 1, NQ, NK, dtype=dtype)
    err = refused("attn_mask", bad, "expected a boolean mask (True = may attend)", attn_mask=bad)
    assert "additive float masks are not supported" in err.fix


def test_mask_not_a_tensor():
    refused("attn_mask", [[True]], "expected a torch.Tensor", attn_mask=[[True]])


def test_mask_more_than_4_dims():
    bad = torch.ones(1, B, HQ, NQ, NK, dtype=torch.bool)
    refused("attn_mask", bad, "more than 4 dimensions", attn_mask=bad)


@pytest.mark.parametrize("shape", [(NQ, NK + 1), (NK - 1,), (B + 1, 1, NQ, NK), (1, 3, NQ, NK), (NQ + 2, 1)])
def test_mask_not_broadcastable(shape):
    bad = torch.ones(shape, dtype=torch.bool)
    err = refused("attn_mask", bad, f"does not broadcast to {(B, HQ, NQ, NK)}", attn_mask=bad)
    assert "(B, Hq, Nq, Nk)" in err.fix


def test_mask_on_another_device():
    bad = torch.ones(NQ, NK, dtype=torch.bool, device="meta")
    refused("attn_mask", bad, "on meta, q on cpu", attn_mask=bad)


# ---- what must be accepted ---------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_accepts_valid_inputs_and_returns_them_as_given(dtype):
    q, k, v = qkv(dtype=dtype)
    q_view = torch.zeros(B, NQ, HQ, D, dtype=dtype).transpose(1, 2)  # views stay views
    out = check_attention_inputs(q_view, k, v, scale=1, causal=None)
    assert out[0] is q_view and out[1] is k and out[2] is v
    assert out[3] == 1.0 and isinstance(out[3], float) and out[4] == "none" and out[5] is None
    assert out[6] == Shapes(B, HQ, HKV, NQ, NK, D, DV) and out[6].group == HQ // HKV


@pytest.mark.parametrize("causal,expected", [(None, "none"), (False, "none"), ("none", "none"),
                                             ("top_left", "top_left"), ("bottom_right", "bottom_right")])
def test_causal_spellings(causal, expected):
    assert call(causal=causal)[4] == expected


@pytest.mark.parametrize("scale", [0.125, -3, np.float16(0.25), np.int64(2), 1e-30, -1e30])
def test_scales_accepted(scale):
    assert call(scale=scale)[3] == float(scale)


@pytest.mark.parametrize("shape", [(), (NK,), (1, NK), (NQ, 1), (NQ, NK), (B, 1, 1, NK), (B, HQ, NQ, NK),
                                   (1, HQ, NQ, 1)])
def test_mask_shapes_accepted(shape):
    mask = torch.ones(shape, dtype=torch.bool)
    assert call(attn_mask=mask)[5] is mask


def test_numpy_arrays_become_tensors():
    q, k, v = (t.numpy() for t in qkv(dtype=torch.float32))
    mask = np.ones((NQ, NK), dtype=bool)
    tq, tk, tv, _, _, tmask, _ = check_attention_inputs(q, k, v, scale=0.5, causal="none", attn_mask=mask)
    assert all(isinstance(t, torch.Tensor) for t in (tq, tk, tv, tmask))
    assert tmask.dtype == torch.bool


def test_gqa_with_one_kv_head_and_dv_different_from_d():
    q, k, v = qkv(k=(B, 1, NK, D), v=(B, 1, NK, 3 * DV))
    shapes = call(q, k, v)[6]
    assert shapes.heads_kv == 1 and shapes.group == HQ and shapes.head_dim_v == 3 * DV
