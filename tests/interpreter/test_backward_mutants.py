"""The planted backward bugs of flashcheck:triton (mutants.BACKWARD_MUTANTS): they apply, run, and each
one gets BUG from check_backward on an input chosen to expose it, where the correct kernel passes."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch

from flashcheck import AttentionCase, check_backward
from flashcheck.kernels.triton.forward import make_kernel
from flashcheck.kernels.triton.mutants import load_mutant, mutant_names, mutant_source
from flashcheck.kernels.triton.planted import AREAS, BACKWARD_MUTANTS, MUTANTS

pytestmark = pytest.mark.interpreter

BLOCK = 16
CPU_MUTANTS = [m.name for m in BACKWARD_MUTANTS if "cpu" in m.devices]


def test_at_least_12_backward_mutants_each_named_and_described():
    names = mutant_names(backward=True)
    assert len(names) >= 12 and len(CPU_MUTANTS) >= 12
    assert not set(names) & set(mutant_names()), "forward and backward mutants share a name"
    assert all(m.target == "backward" and m.area in AREAS and m.description and m.exposed_by for m in BACKWARD_MUTANTS)
    assert all(m.target == "forward" for m in MUTANTS)


@pytest.mark.parametrize("name", mutant_names(backward=True))
def test_backward_edits_give_valid_python_that_differs(name):
    mutated = mutant_source(name)
    compile(mutated, f"<mutant {name}>", "exec")
    assert "triton_attention_backward" in mutated and "_dkdv_kernel" in mutated


@dataclass(frozen=True)
class Probe:
    dtype: str = "fp16"
    n_q: int = 20
    n_k: int = 20
    heads: tuple = (1, 1)
    causal: str = "none"
    empty_row: bool = False  # a boolean mask hiding every key from row 0
    upstream: str = "random"
    scale: float = 0.25


PROBES = {
    "d_missing": Probe(),
    "d_of_kv_head": Probe(heads=(4, 2)),
    "lse_log2_units_backward": Probe(),
    "p_not_masked": Probe(causal="top_left"),
    "causal_top_left_backward": Probe(n_q=24, n_k=40, causal="bottom_right"),
    "causal_diagonal_excluded_backward": Probe(causal="top_left"),
    "scale_missing_in_dq": Probe(),
    "scale_missing_in_dk": Probe(),
    "ds_rounded_to_bf16": Probe(dtype="fp32"),
    "p_rounded_to_bf16_in_dv": Probe(n_q=48, n_k=48, scale=0.02),
    "dv_accumulated_in_fp16": Probe(dtype="fp32", n_q=48),
    "gqa_not_summed": Probe(heads=(4, 2)),
    "tail_query_tile_skipped": Probe(n_q=40),
    "tail_key_tile_skipped_in_dq": Probe(n_k=40),
    "fully_masked_rows_nan_backward": Probe(empty_row=True),
}


def _case(probe: Probe) -> AttentionCase:
    g = torch.Generator().manual_seed(3)
    dtype = {"fp16": torch.float16, "fp32": torch.float32}[probe.dtype]
    hq, hkv = probe.heads
    q = torch.randn(1, hq, probe.n_q, 16, generator=g).to(dtype)
    k = torch.randn(1, hkv, probe.n_k, 16, generator=g).to(dtype)
    v = torch.randn(1, hkv, probe.n_k, 16, generator=g).to(dtype)
    mask = None
    if probe.empty_row:
        mask = torch.rand(1, 1, probe.n_q, probe.n_k, generator=g) < 0.7
        mask[..., 0, :] = False
    return AttentionCase.create(q, k, v, scale=probe.scale, causal=probe.causal, attn_mask=mask)


@functools.lru_cache(maxsize=None)
def _correct():
    return make_kernel(block_m=BLOCK, block_n=BLOCK, input_precision="ieee")


def test_every_cpu_backward_mutant_has_a_probe():
    assert sorted(PROBES) == sorted(CPU_MUTANTS)


@pytest.mark.parametrize("name", CPU_MUTANTS)
def test_check_backward_flags_the_mutant_and_passes_the_correct_kernel(name):
    probe = PROBES[name]
    case = _case(probe)
    good = check_backward(_correct(), case, upstream=probe.upstream, seed=1, device="cpu")
    assert good.status == "PASS", str(good)
    mutant = load_mutant(name, block_m=BLOCK, block_n=BLOCK, input_precision="ieee")
    assert mutant.spec == _correct().spec and f"~{name}" in mutant.name
    bad = check_backward(mutant, case, upstream=probe.upstream, seed=1, device="cpu")
    assert bad.status == "BUG", str(bad)
    assert {f.details.get("gradient") for f in bad.findings} - {None}, str(bad)  # names the gradient
