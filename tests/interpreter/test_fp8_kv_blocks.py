"""flashcheck's Triton fp8 kernel with K and V block scales (the per_block_kv scheme) under the Triton interpreter:
it matches float64 attention over the dequantized values (codes times block scales times descales, an all-zero
block of scale 0 among them) in e4m3 and e5m2, every causal alignment, GQA and Dv != D; flashcheck judges it PASS;
each planted bug is far off (or NaN) and a BUG.

The interpreter runs it because the kernel works around the interpreter's two wrong bf16 operations, which the last
test keeps visible: its fp32 -> bf16 cast truncates, and its bf16 tl.dot multiplies raw bit patterns. Under the
interpreter the kernel rounds P and the output to bf16 on the bits and runs P @ V as an IEEE fp32 dot of the
bf16 values (exact products, fp32 accumulation); the fp8 codes' conversions and the fp8 dot are exact there.
tests/gpu/test_fp8_kv_blocks_gpu.py runs the compiled bf16 path."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck.contract.validation import Shapes
from flashcheck.errors import InvalidArgument
from flashcheck.kernels.planted import FP8_KV_BLOCKS
from flashcheck.kernels.registry import planted_bugs, resolve_kernel

from .._fp8_kv_blocks import NAME, errors, kv_blocks_case, within_tolerance

pytestmark = pytest.mark.interpreter

triton = pytest.importorskip("triton")
tl = triton.language
from flashcheck.kernels.triton.fp8_kv_blocks import to_bf16  # noqa: E402 (imports triton)

DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
CAUSAL = ("none", "top_left", "bottom_right")
# zero_scale_divides's 0 / 0, which numpy reports under the interpreter
ZERO_BY_ZERO = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


@pytest.mark.parametrize("causal", CAUSAL)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_kernel_matches_float64_attention_over_the_dequantized_values(dtype, causal):
    err, largest, lse_err, nan = errors(resolve_kernel(NAME, device="cpu"), kv_blocks_case(dtype=DTYPES[dtype]),
                                        causal)
    assert not nan and within_tolerance(err, largest), (err, largest)
    assert lse_err <= 1e-3, lse_err


def test_gqa_a_head_dim_of_256_dv_apart_and_whole_blocks_only():
    # 6 query heads on 3 K/V heads, D 256 and Dv 80, 48 keys: three whole blocks, the middle one all zero.
    case = kv_blocks_case(Shapes(1, 6, 3, 20, 48, 256, 80), seed=1)
    assert case.k_block_scales.shape == (1, 3, 3) and bool((case.v_block_scales[:, :, 1] == 0).all())
    for causal in CAUSAL:
        err, largest, lse_err, nan = errors(resolve_kernel(NAME, device="cpu"), case, causal)
        assert not nan and within_tolerance(err, largest) and lse_err <= 1e-3, (causal, err, largest, lse_err)


@ZERO_BY_ZERO
@pytest.mark.parametrize("causal", ["none", "bottom_right"])
@pytest.mark.parametrize("mutant", [bug.name for bug in FP8_KV_BLOCKS])
def test_each_planted_bug_is_far_off(mutant, causal):
    err, largest, _, nan = errors(resolve_kernel(f"{NAME}~{mutant}", device="cpu"), kv_blocks_case(), causal)
    if mutant == "zero_scale_divides":
        assert nan  # the all-zero block: 0 / 0
    else:
        assert not nan and err > 0.1 * largest, (err, largest)


@ZERO_BY_ZERO
def test_flashcheck_passes_the_kernel_and_calls_each_planted_bug_a_bug():
    case = kv_blocks_case().attention_case("bottom_right")
    verdict = flashcheck.check(NAME, case, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    for bug in FP8_KV_BLOCKS:
        verdict = flashcheck.check(f"{NAME}~{bug.name}", case, device="cpu", properties=())
        assert verdict.status == "BUG", (bug.name, str(verdict))


def test_the_registry_lists_the_kernel_with_its_scheme_and_planted_bugs():
    kernel = resolve_kernel(NAME, device="cpu")
    spec = kernel.spec
    assert spec.quantization.name == "per_block_kv" and spec.precision.name == "flash"
    assert spec.dtypes == ("fp8_e4m3", "fp8_e5m2") and spec.max_head_dim == 256 and spec.gqa
    assert planted_bugs(NAME) == ("scale_of_next_block_at_edge", "zero_scale_divides", "k_scale_ignored_in_tail")


def test_block_scales_of_another_shape_are_refused_by_name():
    case = kv_blocks_case()
    kwargs = case.kwargs()
    kwargs["v_block_scales"] = kwargs["v_block_scales"][:, :, :-1]
    with pytest.raises(InvalidArgument) as info:
        resolve_kernel(NAME, device="cpu")(*case.tensors(), scale=case.scale, causal="none", **kwargs)
    assert info.value.argument == "v_block_scales"


@triton.jit
def _casts(X, TRUNCATED, ROUNDED, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(X + i)
    tl.store(TRUNCATED + i, x.to(tl.bfloat16))
    tl.store(ROUNDED + i, to_bf16(x, True))


def test_the_interpreter_truncates_fp32_to_bf16_and_the_kernel_rounds_on_the_bits():
    # 1 + 3/512 lies above the midpoint of bf16's 1 + 1/128 and 1 + 2/128; 1 + 1/256 + 1/128 is a tie to even.
    x = torch.tensor([1 + 3 / 512, 1 + 1 / 256 + 1 / 128, 255.9, -0.7682], dtype=torch.float32)
    truncated, rounded = torch.empty(4, dtype=torch.bfloat16), torch.empty(4, dtype=torch.float32)
    _casts[(1,)](x, truncated, rounded, N=4)
    want = x.to(torch.bfloat16)  # torch, the control: to nearest even
    assert torch.equal(rounded, want.float())
    chopped = torch.bitwise_and(x.view(torch.int32), -(1 << 16)).view(torch.float32)  # the low 16 bits dropped
    assert torch.equal(truncated.float(), chopped) and not torch.equal(truncated, want)
