"""Multi-head latent attention's head dims, 576 / 512 (absorbed decode) and 192 / 128 (prefill): the float64
oracle's certified bound holds against mpmath there on adversarial rows, and the budget passes PyTorch's math
backend and the flash twin there. The generic audits (tests/oracle/test_oracle_audit.py) draw head dims up to 32
only. Last, the spec's limit on head dims, 1,024."""

from __future__ import annotations

import pytest
import torch

from flashcheck import InvalidArgument, KernelSpec
from flashcheck.contract.formats import dtype_named, format_of
from flashcheck.contract.head_dims import MAX_HEAD_DIM
from flashcheck.contract.validation import Shapes
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.covering import shape_classes
from flashcheck.inputs.regimes import make_values
from flashcheck.judge.check import check
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.oracle import reference_attention
from flashcheck.numerics.twin import Tiling, twin_attention

MLA_DIMS = [(576, 512), (192, 128)]
SHUFFLE = torch.Generator().manual_seed(0)


def huge_near_ties(shapes: Shapes, dtype: str, seed: int):
    """Logits near 1e5 (every product 64 x 64, of one sign) that differ by a few steps of the dtype at 64 on a
    few columns of each key: weights that stay spread over the keys although every logit is huge."""
    gen = torch.Generator().manual_seed(seed)
    signs = (torch.randint(0, 2, (shapes.head_dim,), generator=gen) * 2 - 1).float()
    step = 128.0 * format_of(dtype).unit_roundoff  # the dtype's spacing at 64
    q = (64.0 * signs).expand(shapes.batch, shapes.heads_q, shapes.n_q, -1).clone()
    k = (64.0 * signs).expand(shapes.batch, shapes.heads_kv, shapes.n_k, -1).clone()
    columns = torch.randint(0, shapes.head_dim, (shapes.n_k, 4), generator=gen)
    nudges = torch.randint(-2, 3, (shapes.n_k, 4), generator=gen).float() * step
    for j in range(shapes.n_k):
        k[..., j, columns[j]] += nudges[j] * signs[columns[j]]
    v = torch.randn(shapes.batch, shapes.heads_kv, shapes.n_k, shapes.head_dim_v, generator=gen)
    t = dtype_named(dtype)
    return q.to(t), k.to(t), v.to(t)


def values(regime: str, shapes: Shapes, dtype: str, seed: int):
    if regime == "huge_near_ties":
        return huge_near_ties(shapes, dtype, seed)
    return make_values(regime, shapes=shapes, dtype=dtype, seed=seed)


def test_the_huge_near_ties_are_huge_and_near():
    for dtype in ("fp16", "bf16"):
        s = Shapes(1, 1, 1, 3, 5, 576, 512)
        q, k, _ = huge_near_ties(s, dtype, seed=0)
        logits = (q.double() @ k.double().transpose(-1, -2)) / 24.0
        top2 = logits.sort(-1, descending=True).values[..., :2]
        assert float(logits.abs().min()) > 9e4, dtype
        assert float((top2[..., 0] - top2[..., 1]).max()) < 8.0, dtype  # the runner-up keeps weight


@pytest.mark.parametrize("d,dv", MLA_DIMS)
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("regime", ["huge_near_ties", "huge_logits", "near_ties", "ties", "cancelling_v"])
def test_float64_bound_holds_against_mpmath_at_mla_dims(d, dv, dtype, regime):
    s = Shapes(1, 1, 1, 3, 5, d, dv)
    q, k, v = values(regime, s, dtype, seed=1)
    for causal in ("none", "bottom_right"):
        audit = audit_reference(q, k, v, scale=d ** -0.5, causal=causal)
        assert audit.empty_rows_agree and audit.elements == s.n_q * dv
        assert audit.worst_ratio <= 1.0, f"|oracle - mpmath| / bound = {audit.worst_ratio} at {audit.worst_index}"
        assert audit.lse_worst_ratio <= 1.0, f"lse: {audit.lse_worst_ratio}"


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("regime", ["huge_near_ties", "near_ties"])
def test_float64_bound_holds_against_mpmath_at_the_limit(dtype, regime):
    q, k, v = values(regime, Shapes(1, 1, 1, 2, 4, 1024, 1024), dtype, seed=3)
    audit = audit_reference(q, k, v, scale=1024 ** -0.5)
    assert audit.ok and audit.worst_ratio > 0, audit


@pytest.mark.parametrize("d,dv", MLA_DIMS)
@pytest.mark.parametrize("regime", ["random", "near_ties", "ties"])
def test_the_bound_stays_far_below_fp32_rounding_at_mla_dims(d, dv, regime):
    """gamma_D grows with D: at 576 the bound must still sit three orders below fp32's unit roundoff."""
    s = Shapes(1, 2, 1, 3, 5, d, dv)
    q, k, v = values(regime, s, "fp32", seed=2)
    ref = reference_attention(q, k, v, scale=d ** -0.5)
    assert float((ref.bound / ref.w).max()) < 2.0 ** -24 / 1e3


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("seed,regime", [(0, "random"), (1, "near_ties"), (2, "growing_max"), (3, "huge_near_ties")])
def test_torch_math_passes_at_576_by_512(dtype, seed, regime):
    s = Shapes(1, 2, 1, 9, 24, 576, 512)
    q, k, v = values(regime, s, dtype, seed=seed)
    case = AttentionCase.create(q, k, v, scale=576 ** -0.5, causal="bottom_right")
    verdict = check("torch:math", case, device="cpu")
    assert verdict.status == "PASS", str(verdict)
    assert verdict.max_ratio <= 1.0


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("tiling", [Tiling(16, 16), Tiling(64, 64, key_order=torch.randperm(40, generator=SHUFFLE))],
                         ids=["16x16", "64x64-shuffled"])
def test_the_flash_twin_stays_within_the_budget_at_576_by_512(dtype, tiling):
    """The twin rounding where the flash contract allows (P to the dtype) at MLA's widest dims."""
    s = Shapes(1, 2, 1, 7, 40, 576, 512)
    worst = 0.0
    for seed, regime in enumerate(("random", "near_ties", "growing_max", "huge_near_ties")):
        q, k, v = values(regime, s, dtype, seed=seed)
        out, _ = twin_attention(q, k, v, scale=576 ** -0.5, causal="bottom_right", tiling=tiling)
        budget = error_budget(q, k, v, scale=576 ** -0.5, causal="bottom_right")
        ratio = float(((out.double() - budget.reference.out).abs() / budget.total).nan_to_num(0.0).max())
        assert ratio <= 1.0, (regime, ratio)
        worst = max(worst, ratio)
    assert worst > 0.05  # the twin rounds: a budget it never approached would test nothing


# The contract: head dims to 1,024, the framework's limit; a kernel keeps declaring its own.

def test_a_spec_takes_head_dims_up_to_1024():
    spec = KernelSpec(max_head_dim=MAX_HEAD_DIM, dv_equals_d=False)
    assert spec.allowed_head_dims()[-1] == 1024 and KernelSpec(head_dims=(192, 576)).head_dims == (192, 576)
    assert spec.unsupported(Shapes(1, 1, 1, 3, 5, 576, 512), dtype="bf16", causal="none", has_mask=False) is None
    assert KernelSpec().max_head_dim == 256  # a plain callable is still tested only where most kernels run


@pytest.mark.parametrize("changes, words", [
    (dict(max_head_dim=1025), r"^max_head_dim=1025: expected a whole number, from 1 to 1024\. flashcheck checks"),
    (dict(head_dims=(64, 2048)), r"^head_dims=2048: .*declare max_head_dim and head_dims within 1 to 1024"),
    (dict(min_head_dim=1100), r"^min_head_dim=1100: exceeds max_head_dim=256"),
])
def test_a_head_dim_past_1024_is_refused_by_name(changes, words):
    with pytest.raises(InvalidArgument, match=words):
        KernelSpec(**changes)


@pytest.mark.parametrize("kernel", ["flashcheck:triton", "flashcheck:triton-varlen", "flashcheck:triton-paged",
                                    "flashcheck:triton-split-kv", "torch:flex"])
def test_kernels_that_stop_at_256_still_say_so(kernel):
    assert resolve_kernel(kernel, device="cpu").spec.max_head_dim == 256


def test_mla_shapes_are_a_shape_class():
    assert "wide_head_dim" in shape_classes(Shapes(1, 16, 1, 1, 300, 576, 512))
    assert "wide_head_dim" in shape_classes(Shapes(1, 1, 1, 1, 1, 64, 512))
    assert "wide_head_dim" not in shape_classes(Shapes(1, 1, 1, 1, 1, 256, 256))

