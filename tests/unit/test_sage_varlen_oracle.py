"""The oracle of SageAttention's varlen call (the ``sage_int8_packed`` scheme): each group of sequences, its keys
smoothed by the mean over the whole packed batch (:mod:`flashcheck.inputs.serving_inside`), quantized as a dense
batch, holds the very codes and scales the packed emulation (:mod:`flashcheck.numerics.sage_packed`, audited
against the package under the interpreter) gives; the slack of compiled division comes with them; and the
quantization error of a serving case is measured against the sequences' own inputs."""

from __future__ import annotations

import torch

from flashcheck import AttentionCase
from flashcheck.contract.quantization import SCHEMES
from flashcheck.inputs.quantization_error import quantization_error
from flashcheck.inputs.serving import ServingCase
from flashcheck.inputs.serving_inside import as_quantized, reads_every_key, with_scheme
from flashcheck.numerics.quantized_inside import inside_values
from flashcheck.numerics.sage import K_BLOCK, Q_BLOCK
from flashcheck.numerics.sage_packed import sage_quantize_packed

VARLEN = SCHEMES["sage_int8_packed"]


def _case(lens=(70, 0, 130, 70), n=130, d=64, dtype=torch.float16) -> ServingCase:
    gen = torch.Generator().manual_seed(3)
    means = 4.0 * torch.arange(len(lens), dtype=torch.float32).reshape(-1, 1, 1, 1)
    q = torch.randn(len(lens), 4, n, d, generator=gen).to(dtype)
    k = (torch.randn(len(lens), 2, n, d, generator=gen) + means).to(dtype)
    v = torch.randn(len(lens), 2, n, d, generator=gen).to(dtype)
    return ServingCase(AttentionCase.create(q, k, v, scale=0.1), "varlen", q_lens=list(lens), k_lens=list(lens))


def _per_token(scales: torch.Tensor, offsets: list, block: int) -> torch.Tensor:
    """Packed (blocks, H) scales spread to the packed tokens (total, H, 1)."""
    out, first = [], 0
    for start, stop in zip(offsets, offsets[1:]):
        blocks = -(-(stop - start) // block)
        out.append(scales[first:first + blocks].repeat_interleave(block, 0)[:stop - start])
        first += blocks
    return torch.cat(out).double()[..., None]


def test_the_groups_values_are_the_packed_quantizers():
    case = with_scheme(_case(), VARLEN)
    q, k, v = case.physical("cpu").tensors
    kw = case.physical("cpu").kwargs
    cu_q, cu_k = kw["cu_seqlens_q"].tolist(), kw["cu_seqlens_k"].tolist()
    packed = sage_quantize_packed(q, k, v, kw["cu_seqlens_q"], kw["cu_seqlens_k"], scale=case.scale)
    want_k = packed.k_codes.double() * _per_token(packed.k_scales, cu_k, K_BLOCK)
    want_q = packed.q_codes.double() * _per_token(packed.q_scales, cu_q, Q_BLOCK)
    quantized = as_quantized(case, "cpu")
    assert reads_every_key(VARLEN) and not reads_every_key(SCHEMES["sage_int8"])
    for group in quantized.groups:
        g = group.case
        inside = inside_values(VARLEN, g.q, g.k, g.v, scale=case.scale, approximate=True)
        for i, b in enumerate(group.indices):
            n = case.q_lens[b]
            keys = want_k[cu_k[b]:cu_k[b] + n].transpose(0, 1)
            assert torch.equal(inside.k[i], keys)
            queries = want_q[cu_q[b]:cu_q[b] + n].transpose(0, 1)  # the oracle's q: these over the multiplier
            assert torch.allclose(inside.q[i] * (queries.abs().max() / inside.q[i].abs().max()), queries, rtol=1e-14,
                                  atol=0)
        assert inside.slack is not None and all(bool((s >= 0).all()) for s in inside.slack)


def test_the_quantization_error_of_a_serving_case_is_against_its_own_inputs():
    error = quantization_error(_case(), "sage_int8_packed")
    assert 0.99 < error.cosine < 1 and 0 < error.max_rel < 0.1
    assert quantization_error(_case(), "per_head") is None
