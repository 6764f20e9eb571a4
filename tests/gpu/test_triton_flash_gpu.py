"""flashcheck:triton compiled on a CUDA GPU, against float64 attention (bf16, fp16, fp32).

Run these in a process of their own (``pytest tests/gpu``): a process that collected the interpreter
tests has TRITON_INTERPRET=1 set, which would run the kernel through the interpreter instead.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck.kernels.triton.forward import make_kernel, triton_attention
from tests._compare import assert_close_to_reference
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
DTYPE_IDS = ["bf16", "fp16", "fp32"]


def qkv(B=2, Hq=4, Hkv=None, Nq=256, Nk=None, D=64, Dv=None, dtype=torch.float16, seed=0):
    Hkv = Hq if Hkv is None else Hkv
    Nk = Nq if Nk is None else Nk
    Dv = D if Dv is None else Dv
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(dtype)

    return randn(B, Hq, Nq, D), randn(B, Hkv, Nk, D), randn(B, Hkv, Nk, Dv)


def check(q, k, v, *, causal="none", attn_mask=None, scale=None, block_m=64, block_n=64,
          input_precision="tf32", **launch):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    out, lse = triton_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                                block_m=block_m, block_n=block_n, input_precision=input_precision, **launch)
    assert out.is_cuda and lse.is_cuda
    # fp32 matmuls run as tf32 unless input_precision="ieee".
    tf32 = q.dtype == torch.float32 and input_precision == "tf32"
    assert_close_to_reference(out, lse, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask,
                              tf32=tf32)
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("causal", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("nq,nk", [(1024, 1024), (300, 1024), (1024, 300)], ids=["eq", "q<k", "q>k"])
@pytest.mark.parametrize("d", [64, 128])
def test_matches_float64(dtype, causal, nq, nk, d):
    q, k, v = qkv(Nq=nq, Nk=nk, D=d, dtype=dtype, seed=nq + nk + d)
    check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_more_queries_than_keys_bottom_right(dtype):
    # fp32 here runs the strict variant (input_precision="ieee"): true fp32 matmuls.
    q, k, v = qkv(Nq=700, Nk=500, D=64, dtype=dtype)
    precision = "ieee" if dtype == torch.float32 else "tf32"
    out, lse = check(q, k, v, causal="bottom_right", input_precision=precision)
    # rows 0..199 see no key
    assert torch.equal(out[:, :, :200], torch.zeros_like(out[:, :, :200]))
    assert bool((lse[:, :, :200] == float("-inf")).all())


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64), (64, 32), (64, 64), (128, 64)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_block_shapes(block_m, block_n, dtype):
    q, k, v = qkv(Nq=511, Nk=769, D=64, dtype=dtype, seed=block_m * block_n)
    check(q, k, v, causal="bottom_right", block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("num_warps,num_stages", [(4, 2), (8, 3), (4, 1)])
def test_launch_options(num_warps, num_stages):
    q, k, v = qkv(Nq=333, Nk=444, D=128, dtype=torch.float16)
    check(q, k, v, causal="top_left", num_warps=num_warps, num_stages=num_stages)


@pytest.mark.parametrize("d,dv", [(16, 16), (40, 40), (80, 80), (96, 96), (256, 256), (64, 128), (128, 48)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_head_dims(d, dv, dtype):
    q, k, v = qkv(Nq=200, Nk=333, D=d, Dv=dv, dtype=dtype, seed=d + dv)
    # Small tiles keep D = 256 inside the shared memory and registers of one program.
    check(q, k, v, causal="bottom_right", block_m=32, block_n=32)


@pytest.mark.parametrize("d,dv", [(16, 16), (24, 16), (32, 8), (40, 32), (64, 16), (128, 24)])
@pytest.mark.parametrize("block_m,block_n", [(64, 64), (128, 64), (64, 128)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_value_head_dims_smaller_than_d(d, dv, block_m, block_n, dtype):
    # V tiles of 32 columns or fewer, narrower than the Q/K tile, were miscompiled by Triton 3.6 on
    # Hopper: wrong outputs from 63 keys on, illegal memory accesses on repeated calls.
    for nk in (1, 2, 63, 200):
        q, k, v = qkv(Hq=4, Hkv=1, Nq=52, Nk=nk, D=d, Dv=dv, dtype=dtype, seed=nk)
        first, _ = check(q, k, v, block_m=block_m, block_n=block_n)
        again, _ = check(q, k, v, block_m=block_m, block_n=block_n)
        assert torch.equal(first, again)

@pytest.mark.parametrize("hq,hkv", [(8, 2), (8, 1), (6, 3)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gqa(hq, hkv, dtype):
    q, k, v = qkv(Hq=hq, Hkv=hkv, Nq=257, Nk=640, D=64, dtype=dtype, seed=hq * hkv)
    check(q, k, v, causal="top_left")


@pytest.mark.parametrize("mask_shape", [(2, 4, 300, 700), (2, 1, 300, 700), (1, 1, 300, 700), (2, 1, 1, 700)],
                         ids=["full", "per-batch", "shared", "key-padding"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_boolean_masks(mask_shape, dtype):
    q, k, v = qkv(Nq=300, Nk=700, D=64, dtype=dtype)
    g = torch.Generator(device="cuda").manual_seed(1)
    mask = torch.rand(mask_shape, generator=g, device="cuda") < 0.6
    if mask_shape[-2] > 1:
        mask[..., ::37, :] = False  # some rows see nothing
    out, lse = check(q, k, v, causal="bottom_right", attn_mask=mask)
    if mask_shape[-2] > 1:
        assert torch.equal(out[..., ::37, :], torch.zeros_like(out[..., ::37, :]))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layouts_give_the_same_bits(dtype):
    q, k, v = qkv(Nq=400, Nk=600, D=64, dtype=dtype)
    base = triton_attention(q, k, v, scale=0.125, causal="top_left")
    assert_close_to_reference(*base, q, k, v, scale=0.125, causal="top_left", attn_mask=None,
                              tf32=dtype == torch.float32)
    # (B, N, H, D) storage seen as (B, H, N, D), and a view sliced out of a bigger buffer.
    transposed = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    sliced = []
    for t in (q, k, v):
        big = torch.full((t.shape[0], t.shape[1] + 1, t.shape[2] + 5, t.shape[3] + 16), float("nan"),
                         dtype=dtype, device="cuda")
        big[:, 1:, 5:, 16:] = t
        sliced.append(big[:, 1:, 5:, 16:])
    for name, (qs, ks, vs) in {"transposed": transposed, "sliced": sliced}.items():
        out, lse = triton_attention(qs, ks, vs, scale=0.125, causal="top_left")
        assert torch.equal(out, base[0]), name
        assert torch.equal(lse, base[1]), name


def test_expanded_heads():
    q, k, v = qkv(B=1, Hq=1, Nq=300, Nk=500, D=64, dtype=torch.bfloat16)
    qe, ke, ve = (t.expand(2, 4, -1, -1) for t in (q, k, v))
    out, _ = check(qe, ke, ve, causal="bottom_right")
    assert torch.equal(out[1, 3], out[0, 0])


def test_kernel_object_on_gpu():
    kern = make_kernel(block_m=64, block_n=32, num_warps=4)
    q, k, v = qkv(Nq=129, Nk=1000, D=128, dtype=torch.bfloat16)
    out, lse = kern(q, k, v, scale=0.1, causal="bottom_right")
    assert_close_to_reference(out, lse, q, k, v, scale=0.1, causal="bottom_right", attn_mask=None)


def test_deterministic():
    q, k, v = qkv(Nq=1024, Nk=1024, D=128, dtype=torch.float16)
    a = triton_attention(q, k, v, scale=0.1, causal="top_left")
    b = triton_attention(q, k, v, scale=0.1, causal="top_left")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_smoke_preset_cases_with_every_property():
    """The smoke preset's kinds of case (every layout, D and Dv from 16 to 64, guard bands, poisoned keys)
    through check() with every property: the first GPU smoke campaign stopped on an illegal memory
    access raised after a kernel run, so each property's rerun is exercised here one case at a time."""
    from flashcheck.judge.check import check as judge
    from flashcheck.inputs.presets import load_preset
    from flashcheck.judge.properties import PROPERTIES
    from flashcheck.inputs.recipe_draws import draw_recipes

    preset = load_preset("smoke")
    kernel = make_kernel()
    recipes = draw_recipes(80, seed=1, spec=kernel.spec, dtypes=list(preset.dtypes), **preset.strategy_options())
    for recipe in recipes:
        verdict = judge(kernel, recipe.build(kernel=kernel.name), device="cuda", properties=PROPERTIES)
        torch.cuda.synchronize()
        assert verdict.status != "BUG", f"{recipe}: {verdict}"


def test_new_lengths_and_layouts_compile_nothing_new():
    """Sizes and strides are not specialised on: once a dtype and tiling has run, other lengths, head
    counts and layouts reuse its compiled kernel (tests/interpreter/test_triton_compilations.py checks
    the specialisations themselves, without a GPU)."""
    from flashcheck.kernels.triton.cache import compilation_stats, watch_compilations

    kern = make_kernel(block_m=32, block_n=64)
    q, k, v = qkv(Nq=1, Nk=1, D=40, dtype=torch.float16)
    kern(q, k, v, scale=0.2, causal="none")
    assert watch_compilations()  # this Triton has the hooks, so a count that does not move means something
    before = compilation_stats()[0]
    for B, Hq, Hkv, Nq, Nk in ((1, 2, 1, 17, 31), (2, 4, 4, 64, 100), (3, 1, 1, 257, 16)):
        q, k, v = qkv(B=B, Hq=Hq, Hkv=Hkv, Nq=Nq, Nk=Nk, D=40, dtype=torch.float16)
        for layout in (lambda t: t, lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)):
            out, lse = kern(layout(q), layout(k), layout(v), scale=0.2, causal="none")
            assert_close_to_reference(out, lse, q, k, v, scale=0.2, causal="none", attn_mask=None)
    assert compilation_stats()[0] == before
