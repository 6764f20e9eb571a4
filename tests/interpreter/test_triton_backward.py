"""flashcheck:triton's backward (kernels/triton_backward.py) under the Triton interpreter: dQ, dK, dV
within their budget on drawn cases, the same bits on a second call, and autograd wiring."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashcheck import check_backward
from flashcheck.inputs.regimes import UPSTREAM_REGIMES
from flashcheck.inputs.recipe_draws import recipes
from flashcheck.kernels.registry import resolve_kernel
from tests._cases import large_v_case

pytestmark = pytest.mark.interpreter

KERNEL = "flashcheck:triton[block_m=16,block_n=16,input_precision=ieee]"


def _kernel():
    return resolve_kernel(KERNEL, device="cpu")


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(recipe=recipes(spec=resolve_kernel(KERNEL, device="cpu").spec, dtypes=["fp16", "fp32"], max_n=24,
                      head_dims=[16, 32], max_batch=1, max_heads=2),
       upstream=st.sampled_from(sorted(UPSTREAM_REGIMES)))
def test_gradients_stay_within_the_budget_and_repeat_bit_for_bit(recipe, upstream):
    case = recipe.build(kernel=KERNEL)
    verdict = check_backward(_kernel(), case, upstream=upstream, seed=recipe.seed, device="cpu")
    assert verdict.status == "PASS", str(verdict)  # deterministic_backward is checked in there too


def test_large_v_with_do_along_o_gives_finite_gradients():
    # dS near 1e5 here: rounded to fp16 (as FA2 does) it would be inf, and the gradients NaN.
    verdict = check_backward(_kernel(), large_v_case(16, 32, 0.25), upstream="aligned", device="cpu")
    assert verdict.status == "PASS", str(verdict)


def test_autograd_runs_the_triton_backward_only_when_gradients_are_asked_for():
    kernel = _kernel()
    assert kernel.spec.backward and kernel.spec.deterministic_backward
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 20, 16, generator=g).half() for _ in range(3))
    out, lse = kernel(q, k, v, scale=0.25, causal="none")
    assert out.grad_fn is None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out2, lse2 = kernel(*leaves, scale=0.25, causal="none")
    assert out2.grad_fn is not None and not lse2.requires_grad
    assert torch.equal(out, out2.detach()) and torch.equal(lse, lse2)
    grads = torch.autograd.grad(out2, leaves, torch.ones_like(out2))
    assert [t.shape for t in grads] == [t.shape for t in (q, k, v)] and all(t.dtype == torch.float16 for t in grads)


def test_a_launch_that_does_not_fit_shared_memory_retries_with_one_stage_then_smaller_tiles():
    import triton
    from triton.runtime.errors import OutOfResources

    from flashcheck.kernels.triton import backward as tb

    tried = []

    class Kernel:
        def __getitem__(self, grid):
            def launch(*args, BLOCK_M, BLOCK_N, num_stages=None, **common):
                tried.append((grid, BLOCK_M, BLOCK_N, num_stages))
                if BLOCK_M * BLOCK_N > 32 * 32:
                    raise OutOfResources(BLOCK_M * BLOCK_N * 4, 32 * 32 * 4, "shared memory")
            return launch

    key = ("test-key", len(tb._PLANS))
    tb._launch(triton, Kernel(), lambda bm, bn: (bm, bn), (), key, block_m=64, block_n=64)
    assert [t[1:] for t in tried] == [(64, 64, None), (64, 64, 1), (32, 64, 1), (32, 32, 1)]
    assert tried[-1][0] == (32, 32) and tb._PLANS[key] == (32, 32, 1)
    tried.clear()
    tb._launch(triton, Kernel(), lambda bm, bn: (bm, bn), (), key, block_m=64, block_n=64)
    assert [t[1:] for t in tried] == [(32, 32, 1)]  # the plan that fit is remembered
