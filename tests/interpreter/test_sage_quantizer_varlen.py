"""flashcheck's emulation of SageAttention 1.0.6's varlen quantizer (flashcheck.numerics.sage_packed) against the
package's own, ``sageattn_varlen``'s smoothing and ``per_block_int8_varlen``, under the Triton interpreter: codes
and scale bits equal on ragged packed batches (empty sequences, lengths on and off the block grid, GQA), fp16, bf16
and fp32, head dims 64 and 128; k smoothed by its mean over every packed token, in place on the caller's k; and
the oracle's path (the mean on the packed tensor, then each group of sequences quantized as a dense batch) giving
the same values. The arithmetic inside a block is the dense quantizer's, audited case by case in
test_sage_quantizer.py; these few cases check what the packing adds."""

from __future__ import annotations

import pytest
import torch

from flashcheck.numerics.sage_packed import sage_quantize_packed

pytestmark = [pytest.mark.interpreter,
              pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")]

pytest.importorskip("triton")
sageattention = pytest.importorskip("sageattention")
core = sageattention.core

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def packed(lengths: list[int], heads: int, d: int, dtype, seed: int, *, offset: float = 0.0):
    """A packed tensor of ``lengths`` tokens a sequence, each sequence with its own spread and mean, and its offsets."""
    g = torch.Generator().manual_seed(seed)
    parts = [torch.randn(n, heads, d, generator=g) * (1 + 4 * torch.rand(1, generator=g)) + offset * b
             for b, n in enumerate(lengths)]
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    return torch.cat(parts).to(dtype), offsets


class Quantized(Exception):
    """Raised by the patched quantizer to stop ``sageattn_varlen`` before its attention kernel."""


def run_until_quantized(q, k, v, cu_q, cu_k, monkeypatch):
    """The codes and scales ``sageattn_varlen`` computes, from its own code path (``is_cuda`` patched to True)."""
    record = {}

    def quantize(*args, **kwargs):
        record["result"] = wrapped(*args, **kwargs)
        raise Quantized

    wrapped = core.per_block_int8_varlen
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(core, "per_block_int8_varlen", quantize)
    with pytest.raises(Quantized):
        sageattention.sageattn_varlen(q, k, v, cu_q, cu_k, int((cu_q[1:] - cu_q[:-1]).max()),
                                      int((cu_k[1:] - cu_k[:-1]).max()))
    monkeypatch.undo()
    q_codes, q_scales, k_codes, k_scales, _, _ = record["result"]
    return q_codes, q_scales[..., 0], k_codes, k_scales[..., 0]


def assert_same(mine: torch.Tensor, theirs: torch.Tensor, name: str) -> None:
    assert mine.shape == theirs.shape and mine.dtype == theirs.dtype, name
    same = mine.view(torch.int32) == theirs.view(torch.int32) if mine.is_floating_point() else mine == theirs
    assert bool(same.all()), (name, int((~same).sum()))


@pytest.mark.parametrize("dtype, d, q_lens, k_lens", [
    ("fp16", 64, [1, 130, 0, 64], [65, 200, 3, 64]),
    ("bf16", 128, [129, 7], [129, 7]),
    ("fp32", 64, [0, 300, 17], [1, 64, 128]),
])
def test_ragged_batches_give_the_packages_codes_and_scales(dtype, d, q_lens, k_lens, monkeypatch):
    q, cu_q = packed(q_lens, 4, d, DTYPES[dtype], seed=d)
    k, cu_k = packed(k_lens, 2, d, DTYPES[dtype], seed=d + 1, offset=30.0)  # the sequences' means apart: GQA 2
    v, _ = packed(k_lens, 2, d, DTYPES[dtype], seed=d + 2)
    before = k.clone()
    got = sage_quantize_packed(q, k, v, cu_q, cu_k)
    assert torch.equal(k, before)  # the emulation leaves its inputs alone
    want = run_until_quantized(q, k, v, cu_q, cu_k, monkeypatch)
    # the package smooths the caller's k in place, by the mean over every packed token
    assert torch.equal(k, before - before.mean(dim=0, keepdim=True)) and torch.equal(k, got.k_smoothed)
    for name, mine, theirs in zip(("q codes", "q scales", "k codes", "k scales"),
                                  (got.q_codes, got.q_scales, got.k_codes, got.k_scales), want):
        assert_same(mine, theirs, name)
