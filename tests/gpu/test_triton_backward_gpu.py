"""flashcheck:triton's backward compiled on a CUDA GPU: dQ, dK, dV within their budget on drawn cases in
bf16, fp16 and fp32 (tf32), the same bits on a second call, long rows, and the large-V case that breaks
FA2's fp16 dS. Run in a process of its own (``pytest tests/gpu``), like the forward's GPU tests."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashcheck import AttentionCase, check_backward
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.inputs.regimes import UPSTREAM_REGIMES
from flashcheck.inputs.recipe_draws import recipes
from tests._cases import large_v_case
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

KERNEL = "flashcheck:triton[block_m=64,block_n=64]"


def _kernel():
    return resolve_kernel(KERNEL, device="cuda")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_drawn_cases_stay_within_the_budget_and_repeat_bit_for_bit(dtype):
    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(recipe=recipes(spec=_kernel().spec, dtypes=[dtype], max_n=300, head_dims=[64, 128], max_heads=4),
           upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))
    def run(recipe, upstream):
        case = recipe.build(kernel=KERNEL)
        verdict = check_backward(_kernel(), case, upstream=upstream, seed=recipe.seed, device="cuda")
        assert verdict.status == "PASS", str(verdict)

    run()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_long_rows(dtype):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 2048, 128, generator=g).to(dtype) for _ in range(3))
    case = AttentionCase.create(q, k, v, scale=128 ** -0.5, causal="bottom_right")
    verdict = check_backward(_kernel(), case, upstream="random", device="cuda")
    assert verdict.status == "PASS", str(verdict)


def test_large_v_with_do_along_o_gives_finite_gradients():
    verdict = check_backward(_kernel(), large_v_case(64, 64, 0.125), upstream="aligned", device="cuda")
    assert verdict.status == "PASS", str(verdict)


def test_the_dq_race_between_key_blocks_gets_bug_on_a_gpu():
    """The planted race (two programs adding to dQ with a plain load and store) loses updates only where
    programs run at once: here, not under the interpreter."""
    from flashcheck.kernels.triton.mutants import load_mutant

    mutant = load_mutant("dq_race_between_key_blocks", block_m=32, block_n=32)
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 4, 256, 64, generator=g).half() for _ in range(3))
    case = AttentionCase.create(q, k, v, scale=0.125)
    statuses = [check_backward(mutant, case, upstream="random", seed=s, device="cuda").status for s in range(4)]
    assert "BUG" in statuses, statuses


def test_every_mix_of_the_variant_flags_is_right_and_compiles_nothing_new():
    """Soft-cap, window, chunk, ALiBi and sinks are runtime flags: after one mix compiled the forward and the
    backward, the other 31 mixes reuse them, and each is judged PASS forward and backward."""
    import flashcheck
    from flashcheck.kernels.triton.cache import compilation_stats

    kernel = resolve_kernel("flashcheck:triton", device="cuda")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 40, 64, generator=g).half() for _ in range(3))
    options = {"softcap": 2.0, "window": (5, 3), "chunk": 16, "alibi_slopes": torch.tensor([0.5, 0.125]),
               "sinks": torch.tensor([1.0, -2.0])}
    counts = []
    for mask in range(1 << len(options)):
        variant = flashcheck.Variant(**{n: x for i, (n, x) in enumerate(options.items()) if mask >> i & 1})
        case = AttentionCase.create(q, k, v, scale=0.125, causal="bottom_right", variant=variant)
        assert flashcheck.check(kernel, case, device="cuda").status == "PASS", variant
        assert check_backward(kernel, case, device="cuda").status == "PASS", variant
        counts.append(compilation_stats()[0])
    assert counts[1:] == counts[:1] * (len(counts) - 1)
