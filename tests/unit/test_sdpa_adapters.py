"""The PyTorch adapters (torch:math, torch:flash, torch:flex) on the CPU against a float64 reference.

Each case checks what the kernel's spec declares, through flashcheck's error model under the spec's
contract: the output within its budget, and the declared promise on rows with no visible key.
"""

from __future__ import annotations

import math

import pytest
import torch

from flashcheck import BackendUnavailable, InvalidArgument, Unsupported
from flashcheck.judge.comparison import compare
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.budget import error_budget

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
CAUSAL = ("none", "top_left", "bottom_right")


def assert_matches_reference(kernel, result, q, k, v, *, scale, causal, attn_mask=None):
    """The kernel's (out, lse) judged by flashcheck's error model under the contract its spec declares:
    within the budget on rows with visible keys, the spec's promise on rows without, lse (when
    returned) fp32 and natural log within its budget."""
    out, lse = result if isinstance(result, tuple) else (result, None)
    B, Hq, Nq, _ = q.shape
    assert out.shape == (B, Hq, Nq, v.shape[3]) and out.dtype == q.dtype, (out.shape, out.dtype)
    if lse is not None:
        assert lse.shape == (B, Hq, Nq) and lse.dtype == torch.float32, (lse.shape, lse.dtype)
    budget = error_budget(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, precision=kernel.spec.precision)
    findings, ratio = compare(out, lse, budget, fully_masked_rows=kernel.spec.fully_masked_rows)
    assert not findings, f"{kernel.name}: " + "\n".join(f.summary() for f in findings)
    return ratio


def make_inputs(B, Hq, Hkv, Nq, Nk, D, Dv, dtype, *, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, Nq, D, generator=g)
    k = torch.randn(B, Hkv, Nk, D, generator=g)
    v = torch.randn(B, Hkv, Nk, Dv, generator=g) + 0.5  # off-centre V: cancellation is not the only regime
    return tuple(t.to(device=device, dtype=dtype) for t in (q, k, v))


def make_mask(shape, *, seed=0, empty_rows=True, device="cpu"):
    """A random boolean mask; with ``empty_rows`` every third query row (if it has one) sees nothing."""
    g = torch.Generator().manual_seed(seed + 1)
    mask = torch.rand(shape, generator=g) > 0.4
    if empty_rows and len(shape) >= 2:
        mask[..., ::3, :] = False
    return mask.to(device)


CPU_KERNELS = {
    "torch:math": {},
    "torch:flash": {},
    "torch:flex[eager]": {"compile": False},
}


@pytest.fixture(scope="module", params=list(CPU_KERNELS))
def kernel(request):
    name = request.param.split("[")[0]
    return resolve_kernel(name, device="cpu", **CPU_KERNELS[request.param])


def run(kernel, q, k, v, *, scale=0.3, causal="none", attn_mask=None):
    result = kernel(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    assert_matches_reference(kernel, result, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return result


# ------------------------------------------------------------------------------------------------
# Specs
# ------------------------------------------------------------------------------------------------


def test_math_spec_is_honest():
    spec = resolve_kernel("torch:math", device="cpu").spec
    assert spec.dtypes == ("fp16", "bf16", "fp32")
    assert spec.causal == CAUSAL
    assert spec.attn_mask and spec.gqa and not spec.dv_equals_d
    assert spec.fully_masked_rows == "zero"
    assert spec.precision.name == "upcast" and not spec.precision.tf32
    assert spec.devices == ("cpu",)


def test_cpu_flash_spec_is_honest():
    spec = resolve_kernel("torch:flash", device="cpu").spec
    assert spec.dtypes == ("fp16", "bf16", "fp32")
    assert spec.causal == CAUSAL
    assert spec.attn_mask and spec.gqa and spec.dv_equals_d
    assert spec.fully_masked_rows == "zero"
    assert spec.precision.name == "flash"


def test_cpu_flash_negative_scale_defect_is_still_there():
    """The spec excludes negative scales because PyTorch's CPU flash kernel gives NaN for them under
    causal masking. flashcheck must still say so when given such a case; when this fails, PyTorch
    fixed it: drop the exclusion."""
    from flashcheck.inputs.recipe import Recipe
    from flashcheck.judge.check import check

    kernel = resolve_kernel("torch:flash", device="cpu")
    assert "negative_scale" in kernel.spec.excludes
    recipe = Recipe.from_dict({"shapes": {"batch": 1, "heads_q": 1, "heads_kv": 1, "n_q": 1, "n_k": 2,
                                          "head_dim": 16, "head_dim_v": 16}, "dtype": "fp16", "values": "random",
                               "mask": "none", "causal": "top_left", "scale": "negative", "layout": "contiguous",
                               "seed": 0})
    verdict = check(kernel, recipe.build(kernel=kernel.name), device="cpu", properties=())
    assert verdict.status == "BUG" and [f.kind for f in verdict.findings] == ["nonfinite"]
    without_causal = Recipe.from_dict({**recipe.as_dict(), "causal": "none"})
    assert check(kernel, without_causal.build(), device="cpu", properties=()).status == "PASS"


def test_cpu_flash_gqa_share_defect_is_still_there():
    """With GQA, PyTorch's CPU flash backward rounds the running sum of the query heads' dK shares to fp16
    after each head: shares of +-120,000 that cancel give +-inf where the exact dK is 0 (a model of that order,
    benchmarks/gqa_share_probe.py, gives its bits). The spec excludes the class; when this fails, PyTorch
    fixed it: drop the exclusion."""
    from flashcheck import check_backward
    from tests._cases import cancelling_group_case

    case, do = cancelling_group_case()
    bad = check_backward("torch:flash", case, do=do, device="cpu")
    assert bad.status == "BUG" and {(f.kind, f.details.get("gradient")) for f in bad.findings} == {("nonfinite", "dk")}
    skipped = check_backward("torch:flash", case, do=do, device="cpu", exclusions=True).skipped
    assert skipped.startswith("excluded: group_share_past_range"), skipped
    assert check_backward("torch:math", case, do=do, device="cpu").status == "PASS"
    control, small = cancelling_group_case(1.0)  # every share at 19,200
    assert check_backward("torch:flash", control, do=small, device="cpu", exclusions=True).status == "PASS"


@pytest.mark.parametrize("name", ["fp16_key_bias_nan", "bf16_head_broadcast_bias"])
def test_the_bias_gradient_is_summed_before_its_one_rounding(name):
    """A half bias goes into SDPA's float mask in fp32 (math and CPU flash take it), so dbias is summed over
    what the mask broadcasts along (rows, heads) before it is rounded to the bias's dtype once. A mask in the
    bias's dtype rounded every element of dS first: an H200 sign-off's torch:math backward got NaN dbias where
    the exact one is finite (fp16, per-element dS past 65,504) and 1.17x the budget (bf16, two heads)."""
    from pathlib import Path

    from flashcheck import AttentionCase, check_backward

    case = AttentionCase.load(Path(__file__).parent / "sdpa_bias_cases" / f"{name}.json")
    for kernel in ("torch:math", "torch:flash"):
        verdict = check_backward(kernel, case, device="cpu")
        assert verdict.status == "PASS", verdict


def test_flex_spec_is_honest():
    for compile in (False, True):
        spec = resolve_kernel("torch:flex", device="cpu", compile=compile).spec
        assert spec.causal == CAUSAL and spec.attn_mask and spec.gqa and not spec.dv_equals_d
        assert spec.fully_masked_rows == "zero" and spec.devices == ("cpu",)


# ------------------------------------------------------------------------------------------------
# Numerics against float64
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("lengths", [(17, 17), (9, 23), (23, 9), (1, 5)], ids=lambda x: f"{x[0]}x{x[1]}")
def test_causal_modes_lengths_and_gqa(kernel, dtype, causal, lengths):
    Nq, Nk = lengths
    q, k, v = make_inputs(2, 4, 2, Nq, Nk, 16, 16, DTYPES[dtype], seed=Nq * 31 + Nk)
    run(kernel, q, k, v, causal=causal)


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("mask_shape", ["Nk", "NqNk", "B11Nk", "1HNqNk", "BHNqNk"])
def test_bool_masks_broadcast(kernel, causal, mask_shape):
    B, Hq, Hkv, Nq, Nk = 2, 4, 2, 13, 21
    shape = {"Nk": (Nk,), "NqNk": (Nq, Nk), "B11Nk": (B, 1, 1, Nk), "1HNqNk": (1, Hq, Nq, Nk),
             "BHNqNk": (B, Hq, Nq, Nk)}[mask_shape]
    q, k, v = make_inputs(B, Hq, Hkv, Nq, Nk, 16, 16, torch.float16, seed=len(shape))
    mask = make_mask(shape, seed=len(shape), empty_rows=len(shape) >= 2)
    run(kernel, q, k, v, causal=causal, attn_mask=mask)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_fully_masked_rows_keep_the_declared_promise(kernel, dtype):
    q, k, v = make_inputs(2, 2, 2, 12, 7, 16, 16, DTYPES[dtype], seed=3)
    # Bottom-right with Nq > Nk leaves the first Nq - Nk rows with no key; the mask empties more.
    out = run(kernel, q, k, v, causal="bottom_right")
    out = out[0] if isinstance(out, tuple) else out
    assert kernel.spec.fully_masked_rows == "zero"
    assert (out[:, :, :5] == 0).all()
    mask = torch.ones(2, 1, 12, 7, dtype=torch.bool)
    mask[0, 0, 7:] = False
    out = run(kernel, q, k, v, causal="none", attn_mask=mask)
    out = out[0] if isinstance(out, tuple) else out
    assert (out[0, :, 7:] == 0).all() and not out.isnan().any()


def test_multi_query_attention(kernel):
    q, k, v = make_inputs(1, 6, 1, 10, 14, 16, 16, torch.bfloat16, seed=5)
    run(kernel, q, k, v, causal="top_left", attn_mask=make_mask((1, 1, 10, 14), seed=5))


@pytest.mark.parametrize("head_dim", [1, 5, 40, 100])
def test_head_dims(kernel, head_dim):
    q, k, v = make_inputs(1, 2, 2, 9, 11, head_dim, head_dim, torch.float32, seed=head_dim)
    run(kernel, q, k, v, scale=1 / math.sqrt(head_dim), causal="bottom_right")


def test_value_head_dim_other_than_d(kernel):
    q, k, v = make_inputs(1, 2, 1, 9, 11, 16, 24, torch.float16, seed=7)
    if kernel.spec.dv_equals_d:
        # A call-time refusal of the forced backend: the input is unsupported, not a crash.
        with pytest.raises(Unsupported) as info:
            kernel(q, k, v, scale=0.25, causal="none")
        assert "last dimension" in info.value.reason  # PyTorch's own words, from its warning
    else:
        run(kernel, q, k, v, scale=0.25, causal="none")


@pytest.mark.parametrize("layout", ["last_dim_strided", "bshd", "offset", "expanded"])
def test_layouts(kernel, layout):
    q, k, v = make_inputs(2, 2, 2, 15, 18, 16, 16, torch.float16, seed=11)
    if layout == "last_dim_strided":  # stride(-1) != 1: the fused backends need a copy
        q, k, v = (t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v))
    elif layout == "bshd":
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    elif layout == "offset":
        q, k, v = (torch.cat([t.new_zeros(5), t.flatten()])[5:].view(t.shape) for t in (q, k, v))
    else:  # one K/V batch entry broadcast over the batch: stride 0
        k, v = k[:1].expand_as(k), v[:1].expand_as(v)
    run(kernel, q, k, v, causal="top_left")


@pytest.mark.parametrize("scale", [-0.7, 1e-3, 4.0])
def test_unusual_scales(kernel, scale):
    q, k, v = make_inputs(1, 2, 2, 8, 8, 16, 16, torch.float32, seed=13)
    run(kernel, q, k, v, scale=scale, causal="none")


def test_bad_input_is_refused_by_name(kernel):
    q, k, v = make_inputs(1, 2, 2, 4, 4, 8, 8, torch.float32)
    with pytest.raises(InvalidArgument, match="causal"):
        kernel(q, k, v, scale=0.3, causal=True)
    with pytest.raises(InvalidArgument, match="attn_mask"):
        kernel(q, k, v, scale=0.3, causal="none", attn_mask=torch.zeros(4, 4))


# ------------------------------------------------------------------------------------------------
# The math backend's precision contract
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_math_upcasts_and_rounds_once(dtype):
    """'upcast': fp32 all the way, one rounding at the end, so the error is about u |o|, not u w."""
    kernel = resolve_kernel("torch:math", device="cpu")
    q, k, v = make_inputs(2, 4, 4, 64, 96, 32, 32, DTYPES[dtype], seed=17)
    v = v - 0.5  # centred V: o cancels well below w, where P rounding (u w) would show
    out = kernel(q, k, v, scale=0.2, causal="none")
    assert kernel.spec.precision.name == "upcast"
    assert_matches_reference(kernel, out, q, k, v, scale=0.2, causal="none")


def test_math_backend_orders_of_operations_are_inside_its_envelope():
    """The math backend scales Q and K by sqrt(scale) and normalises P before P @ V. On coherent P
    rounding with key padding the twin that divides at the end has zero error, so without those
    orders in the envelope a correct backend read as SUSPICIOUS (13 times on the H200)."""
    from flashcheck import check
    from flashcheck.inputs.case import Shapes
    from flashcheck.inputs.recipe import Recipe
    from flashcheck.judge.envelope import reordering_envelope
    from flashcheck.numerics.twin import twin_attention

    recipe = Recipe(shapes=Shapes(2, 1, 1, 131, 131, 128, 128), dtype="fp32", values="coherent_p_rounding",
                    mask="key_padding_left", causal="none", scale="tiny", layout="contiguous", seed=0)
    case = recipe.build(kernel="torch:math")
    verdict = check("torch:math", case, device="cpu", properties=(), envelope=True)
    assert verdict.status == "PASS" and verdict.max_ratio > 0.1, str(verdict)
    budget = error_budget(case.q, case.k, case.v, scale=case.scale, attn_mask=case.attn_mask, precision="upcast")
    divide_last, _ = twin_attention(case.q, case.k, case.v, scale=case.scale, attn_mask=case.attn_mask,
                                    precision="upcast")
    assert compare(divide_last, None, budget)[1] == 0.0  # the old envelope: nothing to compare with
    assert reordering_envelope(case, budget, device="cpu") * 8 > verdict.max_ratio


def test_orders_of_operations_a_contract_does_not_allow_are_refused():
    from flashcheck.numerics.twin import Habits, twin_attention

    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(InvalidArgument, match="softmax_first"):
        twin_attention(q, q, q, scale=0.3, precision="flash", habits=Habits(softmax_first=True))
    with pytest.raises(InvalidArgument, match="scale_inputs"):
        twin_attention(q, q, q, scale=0.3, precision="strict", habits=Habits(scale_inputs=True))


@pytest.fixture
def restore_matmul_precision():
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


def test_math_precision_follows_the_fp32_matmul_setting(restore_matmul_precision):
    torch.set_float32_matmul_precision("high")  # tf32 allowed
    kernel = resolve_kernel("torch:math", device="cpu")
    assert kernel.spec.precision.tf32 and kernel.spec.precision.p_dtype == "fp32"
    torch.set_float32_matmul_precision("highest")
    q, k, v = make_inputs(1, 1, 1, 4, 4, 8, 8, torch.float32)
    with pytest.raises(BackendUnavailable, match="changed from tf32 to ieee"):
        kernel(q, k, v, scale=0.3, causal="none")
    assert resolve_kernel("torch:math", device="cpu").spec.precision.name == "upcast"


def test_bf16_fp32_matmuls_are_refused(restore_matmul_precision):
    torch.set_float32_matmul_precision("medium")  # oneDNN may run fp32 matmuls in bf16
    with pytest.raises(BackendUnavailable) as info:
        resolve_kernel("torch:math", device="cpu")
    assert info.value.backend == "torch:math" and info.value.device == "cpu"
    assert "bfloat16" in info.value.reason


# ------------------------------------------------------------------------------------------------
# FlexAttention
# ------------------------------------------------------------------------------------------------


def test_eager_flex_returns_natural_log_lse():
    kernel = resolve_kernel("torch:flex", device="cpu", compile=False)
    q, k, v = make_inputs(1, 2, 2, 6, 9, 16, 16, torch.float32, seed=19)
    result = kernel(q, k, v, scale=0.5, causal="bottom_right")
    assert_matches_reference(kernel, result, q, k, v, scale=0.5, causal="bottom_right")


@pytest.mark.slow
@pytest.mark.parametrize("case", ["gqa_bottom_right_mask", "top_left_fp16", "plain_bf16_odd_dim"])
def test_compiled_flex_on_cpu(case):
    """The fused C++ kernel torch.compile builds (a few seconds per new shape); it returns no lse."""
    kernel = resolve_kernel("torch:flex", device="cpu")
    if case == "gqa_bottom_right_mask":
        q, k, v = make_inputs(2, 4, 2, 23, 17, 16, 24, torch.float32, seed=23)
        mask, causal = make_mask((2, 1, 23, 17), seed=23), "bottom_right"
    elif case == "top_left_fp16":
        q, k, v = make_inputs(1, 2, 2, 40, 33, 32, 32, torch.float16, seed=29)
        mask, causal = None, "top_left"
    else:
        q, k, v = make_inputs(1, 2, 2, 20, 30, 5, 5, torch.bfloat16, seed=31)
        mask, causal = None, "none"
    result = kernel(q, k, v, scale=0.3, causal=causal, attn_mask=mask)
    assert isinstance(result, torch.Tensor)
    assert_matches_reference(kernel, result, q, k, v, scale=0.3, causal=causal, attn_mask=mask)
