"""torch:int8-qk, the sage_int8 scheme's reference: it passes where its tiles are partial, with GQA and every causal
alignment, and each of its planted bugs breaks the budget on an input that exposes it, with a control that passes;
the poison property stays off for a kernel whose quantizer reads the masked keys too."""

from __future__ import annotations

import pytest
import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.kernels.planted import INT8_QK


def _case(n_q=70, n_k=100, d=64, dtype=torch.float16, causal="none", heads=(4, 2), seed=0, scale=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads[0], n_q, d, generator=gen)
    q[:, :, 64:] *= 8  # rows past the first 128 only where n_q > 128: a block of larger queries
    k = torch.randn(1, heads[1], n_k, d, generator=gen) + 2.0
    v = torch.randn(1, heads[1], n_k, d, generator=gen)
    return AttentionCase.create(q.to(dtype), k.to(dtype), v.to(dtype), scale=d ** -0.5 if scale is None else scale,
                                causal=causal)


@pytest.mark.parametrize(("dtype", "causal", "d"), [(torch.float16, "none", 64), (torch.bfloat16, "top_left", 96),
                                                     (torch.float32, "bottom_right", 128)])
def test_the_reference_passes_with_partial_tiles_and_gqa(dtype, causal, d):
    verdict = flashcheck.check("torch:int8-qk", _case(n_q=200, dtype=dtype, causal=causal, d=d), device="cpu")
    assert verdict.status == "PASS" and verdict.max_ratio < 1, str(verdict)


# Each bug, the case that exposes it and a control of the same kernel that passes.
EXPOSED = {
    "padded_keys_unmasked": (_case(n_k=100), _case(n_k=128)),  # 28 padded keys; none at 128
    "first_block_scale_everywhere": (_case(n_q=200, n_k=64), _case(n_q=100, n_k=64)),  # two query blocks; one
    "scores_in_fp16": (_case(n_q=64, n_k=64, scale=64.0), _case(n_q=64, n_k=64, scale=1e-3)),  # logits of 1000s
}


@pytest.mark.parametrize("bug", [b.name for b in INT8_QK])
def test_each_planted_bug_breaks_the_budget_where_exposed_and_passes_its_control(bug):
    exposed, control = EXPOSED[bug]
    verdict = flashcheck.check(f"torch:int8-qk~{bug}", exposed, device="cpu", properties=())
    assert verdict.status == "BUG" and any(f.kind == "over_budget" for f in verdict.findings), str(verdict)
    passed = flashcheck.check(f"torch:int8-qk~{bug}", control, device="cpu", properties=())
    assert passed.status == "PASS", str(passed)


def test_poisoned_masked_keys_move_the_quantization_so_the_property_does_not_apply():
    case = _case(n_q=64, n_k=64, causal="top_left")
    verdict = flashcheck.check("torch:int8-qk", case, device="cpu", properties=("poison",))
    assert verdict.status == "PASS" and verdict.properties == ["poison"], str(verdict)
