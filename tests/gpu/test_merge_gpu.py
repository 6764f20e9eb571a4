"""check_merge on CUDA: the states reach the merge on the GPU it names, in both conventions, and the judgement
(on the CPU, in float64) is the one the same merge gets on the CPU."""

from __future__ import annotations

import pytest
import torch

import flashcheck

from ..repro.planted_merge import pair_fixed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _pair(a, la, b, lb):
    assert a.is_cuda and la.is_cuda and b.is_cuda and lb.is_cuda
    return pair_fixed(a, la, b, lb)


def _states(outs, lses):
    assert outs.is_cuda and lses.is_cuda
    out, lse = outs[0].float(), lses[0]  # in fp32 throughout, rounded once
    for o, l in zip(outs[1:], lses[1:]):
        out, lse = _pair(out, lse, o.float(), l)
    return out.to(outs.dtype), lse


@pytest.mark.parametrize("merge, convention", [(_pair, "pair"), (_states, "states")])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_a_merge_on_the_gpu_gets_cuda_states_and_passes(merge, convention, device):
    verdict = flashcheck.check_merge(merge, convention=convention, device=device, dtype="fp16", cases=48)
    assert verdict.status == "PASS", str(verdict)
