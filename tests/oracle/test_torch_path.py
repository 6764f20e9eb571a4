"""The torch float64 code path (the GPU's) gives what the numpy path gives, checked on the CPU.

CI has no GPU; FLASHCHECK_TORCH_OPS=1 runs the oracle and the budget through torch on CPU tensors, so a
torch-only mistake (a scalar where torch wants a tensor, say) fails here and not first on a GPU.
"""

from __future__ import annotations

import pytest
import torch

from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.oracle import reference_attention
from flashcheck.inputs.regimes import make_mask, make_values
from flashcheck.contract.validation import Shapes


@pytest.mark.parametrize("values", ["random", "huge_logits", "subnormal_p", "cancelling_v"])
@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_torch_path_matches_numpy_path(monkeypatch, values, dtype):
    s = Shapes(2, 4, 2, 37, 70, 32, 24)
    q, k, v = make_values(values, shapes=s, dtype=dtype, seed=2)
    kw = dict(scale=0.2, causal="bottom_right", attn_mask=make_mask("fully_masked_rows", shapes=s, seed=2))
    runs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("FLASHCHECK_TORCH_OPS", flag)
        ref = reference_attention(q, k, v, **kw)
        runs[flag] = (ref, error_budget(q, k, v, precision="flash", reference=ref, **kw))
    (ref_np, bud_np), (ref_t, bud_t) = runs["0"], runs["1"]
    assert torch.equal(ref_np.empty_rows, ref_t.empty_rows)
    live = ~ref_np.empty_rows[..., None].expand_as(ref_np.out)
    assert bool(((ref_np.out - ref_t.out).abs()[live] <= (ref_np.bound + ref_t.bound)[live]).all())
    torch.testing.assert_close(bud_t.total, bud_np.total, rtol=1e-9, atol=0)
    torch.testing.assert_close(bud_t.lse_total, bud_np.lse_total, rtol=1e-9, atol=0)


def test_large_eta_path_in_torch(monkeypatch):
    """fp32 logits near 1e60 take the oracle's log-domain branch (minimum/maximum with scalars)."""
    monkeypatch.setenv("FLASHCHECK_TORCH_OPS", "1")
    q = torch.randn(1, 1, 5, 16) * 1e30
    k = torch.randn(1, 1, 7, 16) * 1e30
    v = torch.randn(1, 1, 7, 16)
    ref = reference_attention(q, k, v, scale=1e-3)
    assert bool(torch.isfinite(ref.bound).all())


@pytest.mark.parametrize("flag", ["0", "1"])
@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_non_finite_inputs_are_refused_by_name(monkeypatch, flag, name):
    import flashcheck

    monkeypatch.setenv("FLASHCHECK_TORCH_OPS", flag)
    t = {n: torch.randn(1, 2, 5, 8) for n in "qkv"}
    t[name][0, 1, 3, 2] = float("nan")
    with pytest.raises(flashcheck.InvalidArgument, match=f"^{name}=.*NaN or infinity"):
        reference_attention(t["q"], t["k"], t["v"], scale=0.3)
