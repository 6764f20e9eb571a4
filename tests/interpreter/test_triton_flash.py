"""flashcheck:triton under the Triton interpreter (CPU tensors), against float64 attention.

Sizes stay small (the interpreter runs every tile through numpy). bf16 is checked on the GPU only:
the interpreter's tl.dot on bf16 is garbage (see test_bf16_interpreter_is_garbage).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from flashcheck.contract.precision import PRESETS
from flashcheck.contract.spec import Kernel
from flashcheck.errors import InvalidArgument
from flashcheck.kernels.triton.forward import make_kernel, triton_attention
from tests._compare import assert_close_to_reference, reference

pytestmark = pytest.mark.interpreter

F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


def qkv(B=1, Hq=2, Hkv=None, Nq=33, Nk=None, D=32, Dv=None, dtype=F16, seed=0):
    """Random normal q, k, v, rounded to ``dtype`` (the rounded values are the exact inputs)."""
    Hkv = Hq if Hkv is None else Hkv
    Nk = Nq if Nk is None else Nk
    Dv = D if Dv is None else Dv
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Nk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Nk, Dv, generator=g).to(dtype)
    return q, k, v


def check(q, k, v, *, causal="none", attn_mask=None, scale=None, block_m=32, block_n=32):
    """Run the kernel and compare it with float64 attention; return (out, lse)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = triton_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                                block_m=block_m, block_n=block_n)
    assert_close_to_reference(out, lse, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return out, lse


# -- causal alignments, Nq == Nk, Nq < Nk, Nq > Nk ---------------------------------------------------


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("nq,nk", [(70, 70), (45, 100), (100, 45)], ids=["eq", "q<k", "q>k"])
def test_causal_alignments(dtype, causal, nq, nk):
    q, k, v = qkv(Nq=nq, Nk=nk, dtype=dtype, seed=nq + nk)
    check(q, k, v, causal=causal)


def test_bottom_right_with_more_queries_than_keys_leaves_empty_rows():
    q, k, v = qkv(Nq=50, Nk=20, D=16)
    out, lse = check(q, k, v, causal="bottom_right", block_m=16, block_n=16)
    # query i sees keys j <= i - 30: rows 0..29 see nothing.
    assert torch.equal(out[:, :, :30], torch.zeros_like(out[:, :, :30]))
    assert bool((lse[:, :, :30] == float("-inf")).all())
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse[:, :, 30:]).all())


# -- sequence lengths and tile shapes --------------------------------------------------------------


@pytest.mark.parametrize(
    "nq,nk,causal",
    [
        (1, 1, "none"),
        (1, 1, "top_left"),
        (1, 129, "bottom_right"),
        (129, 1, "top_left"),
        (17, 17, "none"),
        (63, 63, "top_left"),
        (65, 65, "bottom_right"),
        (127, 127, "none"),
        (129, 129, "top_left"),
        (131, 131, "bottom_right"),  # a prime
        (63, 131, "top_left"),
    ],
)
def test_lengths(nq, nk, causal):
    q, k, v = qkv(Nq=nq, Nk=nk, D=16, seed=nq * 1000 + nk)
    check(q, k, v, causal=causal, block_m=64, block_n=64)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64), (64, 32), (64, 64)])
@pytest.mark.parametrize("dtype,causal", [(F16, "bottom_right"), (F32, "top_left")], ids=["fp16", "fp32"])
def test_block_shapes(block_m, block_n, dtype, causal):
    q, k, v = qkv(Nq=77, Nk=150, D=24, dtype=dtype, seed=block_m + block_n)
    check(q, k, v, causal=causal, block_m=block_m, block_n=block_n)


def test_tile_size_does_not_change_empty_rows_or_shapes():
    q, k, v = qkv(Nq=40, Nk=24, D=16, dtype=F32)
    outs = [triton_attention(q, k, v, scale=0.25, causal="bottom_right", block_m=bm, block_n=bn)
            for bm, bn in [(16, 16), (64, 32)]]
    for out, lse in outs:
        assert torch.equal(out[:, :, :16], torch.zeros_like(out[:, :, :16]))
        assert bool((lse[:, :, :16] == float("-inf")).all())
    for out, lse in outs:
        assert_close_to_reference(out, lse, q, k, v, scale=0.25, causal="bottom_right")


# -- head dims, Dv != D, GQA ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "d,n,dtype",
    [(16, 40, F16), (24, 40, F32), (40, 40, F16), (64, 40, F32), (96, 12, F16), (256, 9, F32),
     (256, 9, F16)],
)
def test_head_dims(d, n, dtype):
    q, k, v = qkv(Nq=n, Nk=n + 5, D=d, dtype=dtype, seed=d)
    check(q, k, v, causal="bottom_right", block_m=16, block_n=16)


@pytest.mark.parametrize("d,dv", [(32, 48), (64, 16), (24, 80), (16, 7)])
def test_value_head_dim_differs(d, dv):
    q, k, v = qkv(Nq=30, Nk=37, D=d, Dv=dv, seed=d * dv)
    out, _ = check(q, k, v, causal="top_left")
    assert out.shape[-1] == dv


@pytest.mark.parametrize("hq,hkv", [(4, 2), (4, 1), (3, 1)])
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
def test_gqa(hq, hkv, causal):
    q, k, v = qkv(B=2, Hq=hq, Hkv=hkv, Nq=20, Nk=35, D=16, seed=hq * 10 + hkv)
    check(q, k, v, causal=causal, block_m=16, block_n=16)


def test_gqa_reads_kv_head_h_over_group():
    # Each kv head holds a constant value row; query head h must return kv head h // 2's constant.
    q, k, _ = qkv(Hq=4, Hkv=2, Nq=8, Nk=8, D=16, dtype=F32)
    v = torch.stack([torch.full((8, 16), 1.0), torch.full((8, 16), 2.0)]).unsqueeze(0)
    out, lse = triton_attention(q, k, v, scale=0.25, block_m=16, block_n=16)
    assert_close_to_reference(out, lse, q, k, v, scale=0.25, causal="none")
    assert [round(float(out[0, h].mean())) for h in range(4)] == [1, 1, 2, 2]


# -- boolean masks ---------------------------------------------------------------------------------------


def random_mask(shape, *, seed, p=0.7, empty_rows=()):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(shape, generator=g) < p
    for row in empty_rows:
        mask[..., row, :] = False
    return mask


@pytest.mark.parametrize(
    "mask_shape",
    [(2, 2, 40, 50), (2, 1, 40, 50), (1, 1, 40, 50), (40, 50), (2, 1, 1, 50), (1, 2, 40, 1)],
    ids=["full", "per-batch", "shared", "2d", "key-padding", "one-key"],
)
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
def test_boolean_mask_broadcasting(mask_shape, causal):
    q, k, v = qkv(B=2, Hq=2, Nq=40, Nk=50, D=16, seed=len(mask_shape))
    empty = (3, 17, 39) if mask_shape[-2] == 40 else ()
    mask = random_mask(mask_shape, seed=sum(mask_shape), empty_rows=empty)
    out, lse = check(q, k, v, causal=causal, attn_mask=mask, block_m=16, block_n=16)
    for row in empty:
        assert torch.equal(out[..., row, :], torch.zeros_like(out[..., row, :]))
        assert bool((lse[..., row] == float("-inf")).all())


def test_mask_and_causal_together_in_fp32():
    q, k, v = qkv(B=1, Hq=2, Nq=33, Nk=65, D=32, dtype=F32)
    mask = random_mask((1, 2, 33, 65), seed=7, p=0.5, empty_rows=(0, 32))
    check(q, k, v, causal="top_left", attn_mask=mask)


def test_all_false_mask_gives_zero_and_minus_inf():
    q, k, v = qkv(Nq=20, Nk=20, D=16, dtype=F32)
    mask = torch.zeros(1, 1, 20, 20, dtype=torch.bool)
    out, lse = triton_attention(q, k, v, scale=0.25, attn_mask=mask, block_m=16, block_n=16)
    assert torch.equal(out, torch.zeros_like(out))
    assert bool((lse == float("-inf")).all())


# -- layouts: non-contiguous views give the same bits as contiguous copies ------------------------


def layouts(q, k, v):
    """(name, q, k, v) views holding the same numbers as q, k, v in other layouts."""
    B, Hq, Nq, D = q.shape
    yield "transposed (B, N, H, D)", *(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))

    def strided(t):  # every other element of every dimension, from a bigger buffer with an offset
        big = torch.full([2 * s + 1 for s in t.shape], float("nan"), dtype=t.dtype)
        big[1::2, 1::2, 1::2, 1::2] = t
        return big[1::2, 1::2, 1::2, 1::2]

    yield "sliced with stride 2 everywhere", *(strided(t) for t in (q, k, v))
    yield "head dim first", *(t.permute(0, 1, 3, 2).contiguous().permute(0, 1, 3, 2) for t in (q, k, v))


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
def test_non_contiguous_layouts_match_contiguous_bits(dtype):
    q, k, v = qkv(B=2, Hq=2, Nq=30, Nk=45, D=24, Dv=40, dtype=dtype)
    base_out, base_lse = triton_attention(q, k, v, scale=0.2, causal="bottom_right", block_m=16, block_n=32)
    assert_close_to_reference(base_out, base_lse, q, k, v, scale=0.2, causal="bottom_right", attn_mask=None)
    for name, qs, ks, vs in layouts(q, k, v):
        assert not (qs.is_contiguous() and ks.is_contiguous() and vs.is_contiguous()), name
        out, lse = triton_attention(qs, ks, vs, scale=0.2, causal="bottom_right", block_m=16, block_n=32)
        assert torch.equal(out, base_out), name
        assert torch.equal(lse, base_lse), name


def test_expanded_stride_zero_heads_and_batch():
    q, k, v = qkv(B=1, Hq=1, Nq=25, Nk=40, D=16, seed=3)
    # One key/value head broadcast to 3 heads and 2 batch entries with stride 0, queries likewise.
    qe, ke, ve = (t.expand(2, 3, -1, -1) for t in (q, k, v))
    assert ke.stride()[:2] == (0, 0)
    out, lse = check(qe, ke, ve, causal="top_left", block_m=16, block_n=16)
    assert torch.equal(out[1, 2], out[0, 0])


def test_mask_given_as_non_contiguous_view():
    q, k, v = qkv(Nq=24, Nk=36, D=16)
    mask = random_mask((1, 1, 36, 24), seed=5).transpose(-1, -2)  # (1, 1, 24, 36), strides swapped
    assert not mask.is_contiguous()
    out, lse = check(q, k, v, attn_mask=mask, block_m=16, block_n=16)
    ref_out, ref_lse = triton_attention(q, k, v, scale=0.25, attn_mask=mask.contiguous(),
                                        block_m=16, block_n=16)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


# -- never reads what it must not: NaN around and behind the inputs ----------------------------------


def test_memory_past_the_end_is_never_read():
    q, k, v = qkv(Nq=37, Nk=45, D=40, Dv=24, dtype=F32)

    def in_nan(t):  # t inside a NaN buffer: more rows after it, more columns beside it
        big = torch.full((t.shape[0], t.shape[1], t.shape[2] + 64, 64), float("nan"), dtype=t.dtype)
        big[:, :, : t.shape[2], : t.shape[3]] = t
        return big[:, :, : t.shape[2], : t.shape[3]]

    clean = triton_attention(q, k, v, scale=0.3, causal="bottom_right", block_m=32, block_n=32)
    poisoned = triton_attention(in_nan(q), in_nan(k), in_nan(v), scale=0.3, causal="bottom_right",
                                block_m=32, block_n=32)
    assert torch.equal(clean[0], poisoned[0]) and torch.equal(clean[1], poisoned[1])


def test_keys_hidden_from_every_query_may_hold_nan():
    # Key padding: keys 30.. are masked for every query, so NaN stored there must not matter.
    q, k, v = qkv(B=2, Nq=20, Nk=48, D=16, dtype=F16)
    mask = torch.ones(2, 1, 1, 48, dtype=torch.bool)
    mask[..., 30:] = False
    kp, vp = k.clone(), v.clone()
    kp[:, :, 30:] = float("nan")
    vp[:, :, 30:] = float("nan")
    clean = triton_attention(q, k, v, scale=0.25, attn_mask=mask, block_m=16, block_n=16)
    poisoned = triton_attention(q, kp, vp, scale=0.25, attn_mask=mask, block_m=16, block_n=16)
    assert torch.equal(clean[0], poisoned[0]) and torch.equal(clean[1], poisoned[1])


def test_causally_hidden_keys_may_hold_nan():
    # Top-left with Nk > Nq: keys past the last query are hidden from every row; K and V NaN there
    # must not matter. (Inside a diagonal tile, a NaN in V at a key that *some* row of the tile sees
    # reaches the other rows as 0 * NaN in P @ V, as in every flash kernel; K may hold NaN anywhere.)
    q, k, v = qkv(Nq=32, Nk=64, D=16, dtype=F32)
    kp, vp = k.clone(), v.clone()
    kp[:, :, 32:] = float("nan")
    vp[:, :, 32:] = float("nan")
    clean = triton_attention(q, k, v, scale=0.25, causal="top_left", block_m=16, block_n=16)
    poisoned = triton_attention(q, kp, vp, scale=0.25, causal="top_left", block_m=16, block_n=16)
    assert torch.equal(clean[0], poisoned[0]) and torch.equal(clean[1], poisoned[1])
    # K alone may be NaN at every hidden (i, j), diagonal tiles included.
    kq = k.clone()
    kq[:, :, 10] = float("nan")  # key 10 is hidden from queries 0..9, visible to 10..31
    out, lse = triton_attention(q, kq, v, scale=0.25, causal="top_left", block_m=16, block_n=16)
    assert torch.equal(out[:, :, :10], clean[0][:, :, :10])
    assert bool(torch.isnan(out[:, :, 10:]).all())  # a visible NaN key is a NaN logit: propagated


# -- numerical regimes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [F16, F32], ids=["fp16", "fp32"])
def test_running_max_grows_at_every_tile(dtype):
    # Logits up to ~60, keys sorted so that each key tile holds a larger max than the last:
    # every tile rescales the accumulator by a tiny alpha.
    q, k, v = qkv(Nq=20, Nk=96, D=16, dtype=F32, seed=11)
    q = (q * 2).to(dtype)
    order = (q.float().mean(dim=2, keepdim=True) @ k.transpose(-1, -2)).squeeze(2).argsort(dim=-1)
    k = torch.gather(k, 2, order.unsqueeze(-1).expand_as(k)).mul(2).to(dtype)
    check(q, k, v.to(dtype), scale=1.0, block_m=16, block_n=16)


@pytest.mark.parametrize("scale", [-0.7, 0.0, 1e-3, 3.0])
def test_scales(scale):
    q, k, v = qkv(Nq=30, Nk=40, D=16, dtype=F32, seed=int(abs(scale) * 10))
    check(q, k, v, scale=scale, causal="bottom_right", block_m=16, block_n=16)


def test_scale_zero_is_the_mean_of_visible_values():
    q, k, v = qkv(Nq=16, Nk=16, D=16, dtype=F32)
    out, lse = triton_attention(q, k, v, scale=0.0, causal="top_left", block_m=16, block_n=16)
    assert_close_to_reference(out, lse, q, k, v, scale=0.0, causal="top_left")
    # Row i is the mean of values 0..i: the last row, the mean of all, is the oracle's too.
    ref = reference(q, k, v, scale=0.0, causal="top_left")
    assert float((ref.out[..., -1, :] - v.double().mean(dim=2)).abs().max()) <= float(ref.bound[..., -1, :].max())


def test_values_far_from_zero_and_cancelling_outputs():
    q, k, v = qkv(Nq=40, Nk=40, D=32, dtype=F16, seed=9)
    check(q, k, (v + 100).to(F16), causal="top_left")  # V all positive, large
    check(q, k, (v * 1e-3).to(F16), causal="none")  # small outputs, near fp16 subnormals


def test_deterministic():
    q, k, v = qkv(Nq=40, Nk=50, D=16)
    a = triton_attention(q, k, v, scale=0.3, causal="top_left")
    b = triton_attention(q, k, v, scale=0.3, causal="top_left")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# -- bf16 under the interpreter ------------------------------------------------------------------------


def test_bf16_interpreter_is_garbage():
    # Known Triton interpreter defect: tl.dot on bf16 operands multiplies their raw uint16 bit
    # patterns. The kernel deliberately does not work around it (flashcheck must detect it), so
    # here bf16 must come out far from float64 attention. bf16 correctness is tested on the GPU.
    q, k, v = qkv(Nq=20, Nk=20, D=16, dtype=BF16)
    out, lse = triton_attention(q, k, v, scale=0.25, block_m=16, block_n=16)
    assert out.dtype == BF16 and lse.dtype == F32
    ref = reference(q, k, v, scale=0.25, causal="none")
    err = (out.double() - ref.out).abs().nan_to_num(float("inf"))
    assert float(err.max()) > 10 * float(ref.out.abs().max()), "the interpreter's bf16 dot was fixed?"


# -- input validation --------------------------------------------------------------------------------


def _raises(argument, fn, *args, **kwargs):
    with pytest.raises(InvalidArgument) as info:
        fn(*args, **kwargs)
    assert info.value.argument == argument
    assert str(info.value).startswith(f"{argument}="), str(info.value)
    return info.value


@pytest.mark.parametrize(
    "argument,changes",
    [
        ("q", dict(D=8)),
        ("q", dict(D=264)),
        ("v", dict(Dv=300)),
    ],
)
def test_head_dims_outside_the_range_are_refused(argument, changes):
    q, k, v = qkv(Nq=4, **changes)
    err = _raises(argument, triton_attention, q, k, v, scale=1.0)
    assert "256" in str(err)


@pytest.mark.parametrize(
    "argument,value",
    [("block_m", 48), ("block_m", 8), ("block_n", 0), ("block_n", 512), ("block_n", 32.0),
     ("block_m", True), ("num_warps", 3), ("num_stages", 0), ("input_precision", "tf32x3")],
)
def test_bad_options_are_refused_by_name(argument, value):
    q, k, v = qkv(Nq=4, D=16)
    _raises(argument, triton_attention, q, k, v, scale=1.0, **{argument: value})
    _raises(argument, make_kernel, **{argument: value})


def test_calling_convention_errors_name_the_argument():
    q, k, v = qkv(Nq=4, D=16)
    _raises("causal", triton_attention, q, k, v, scale=1.0, causal="diagonal")
    _raises("causal", triton_attention, q, k, v, scale=1.0, causal=True)
    _raises("scale", triton_attention, q, k, v, scale=float("nan"))
    _raises("attn_mask", triton_attention, q, k, v, scale=1.0, attn_mask=torch.zeros(1, 1, 4, 4))
    _raises("attn_mask", triton_attention, q, k, v, scale=1.0, attn_mask=torch.ones(3, 4, dtype=torch.bool))
    _raises("k", triton_attention, q, k.float(), v, scale=1.0)
    _, k3, v3 = qkv(Hq=3, Nq=4, D=16)
    _raises("k", triton_attention, q, k3, v3, scale=1.0)  # 2 query heads, 3 kv heads
    _raises("q.dtype", triton_attention, q.double(), k.double(), v.double(), scale=1.0)


# -- the Kernel object ---------------------------------------------------------------------------------


def test_make_kernel_spec_and_name():
    kern = make_kernel(block_m=64, block_n=32)
    assert isinstance(kern, Kernel)
    assert kern.name == "flashcheck:triton[block_m=64,block_n=32]"
    spec = kern.spec
    assert spec.dtypes == ("fp16", "bf16", "fp32")
    assert spec.causal == ("none", "top_left", "bottom_right")
    assert spec.attn_mask and spec.gqa and not spec.dv_equals_d
    assert (spec.min_head_dim, spec.max_head_dim, spec.head_dims) == (16, 256, None)
    assert spec.fully_masked_rows == "zero"
    assert spec.precision == PRESETS["flash"]
    strict = make_kernel(input_precision="ieee")
    assert strict.spec.precision == PRESETS["strict"]
    assert strict.name == "flashcheck:triton[block_m=64,block_n=64,input_precision=ieee]"


def test_kernel_object_follows_the_calling_convention():
    kern = make_kernel(block_m=16, block_n=32)
    q, k, v = qkv(Nq=21, Nk=30, D=16, dtype=F32)
    mask = random_mask((21, 30), seed=1)
    out, lse = kern(q, k, v, scale=0.5, causal="bottom_right", attn_mask=mask)
    assert_close_to_reference(out, lse, q, k, v, scale=0.5, causal="bottom_right", attn_mask=mask)


# -- import hygiene and the device rule ------------------------------------------------------------


def test_import_is_lazy_and_cpu_needs_the_interpreter():
    script = textwrap.dedent(
        """
        import sys
        import torch
        import flashcheck, flashcheck.kernels.triton.forward as tf
        assert "triton" not in sys.modules, "importing flashcheck imported triton"
        kern = tf.make_kernel()
        assert "triton" not in sys.modules, "make_kernel imported triton"
        q = torch.randn(1, 1, 4, 16)
        try:
            tf.triton_attention(q, q, q, scale=1.0)
        except flashcheck.BackendUnavailable as e:
            assert "TRITON_INTERPRET" in str(e), str(e)
        else:
            raise AssertionError("CPU tensors ran without the interpreter")
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
