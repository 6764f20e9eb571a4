"""The float64 oracle on the GPU (torch float64) agrees with the CPU one (numpy) within the bounds."""

from __future__ import annotations

import pytest
import torch

from flashcheck.numerics.oracle import reference_attention
from flashcheck.inputs.regimes import VALUE_REGIMES, make_mask, make_values
from flashcheck.contract.validation import Shapes

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("values", sorted(VALUE_REGIMES))
@pytest.mark.parametrize("causal, mask", [("none", "none"), ("bottom_right", "fully_masked_rows"),
                                          ("top_left", "key_padding_left")])
def test_gpu_oracle_agrees_with_cpu_oracle(dtype, values, causal, mask):
    s = Shapes(2, 4, 2, 193, 517, 64, 48)
    q, k, v = make_values(values, shapes=s, dtype=dtype, seed=11)
    m = make_mask(mask, shapes=s, seed=11)
    kw = dict(scale=0.125, causal=causal)
    cpu = reference_attention(q, k, v, attn_mask=m, **kw)
    gpu = reference_attention(q.cuda(), k.cuda(), v.cuda(), attn_mask=None if m is None else m.cuda(), **kw)
    assert gpu.out.is_cuda
    assert torch.equal(cpu.empty_rows, gpu.empty_rows.cpu())
    live = ~cpu.empty_rows[..., None].expand_as(cpu.out)
    err = (cpu.out - gpu.out.cpu()).abs()[live]
    allowed = (cpu.bound + gpu.bound.cpu())[live]
    assert bool((err <= allowed).all()), f"max err/bound {float((err / allowed).max())}"
    lse_live = ~cpu.empty_rows
    lse_err = (cpu.lse - gpu.lse.cpu()).abs()[lse_live]
    assert bool((lse_err <= (cpu.lse_bound + gpu.lse_bound.cpu())[lse_live]).all())
