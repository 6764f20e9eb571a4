"""Split-KV kernels (spec ``num_splits``) are judged at every split count: the fp32 reference ``torch:split-kv``
passes at 1 to 32 splits, a merge that turns empty splits into NaN is found where more splits than keys leave
some empty, partial lse in base 2 is named, and a promise of split invariance is held to the bits."""

from __future__ import annotations

import torch

import flashcheck
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.packing import serving_case
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.kernels.split_kv import SPLIT_COUNTS


def _case(causal="none", packing="ragged", dtype=torch.float16):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 4, 3, 32, generator=gen).to(dtype)
    k, v = (torch.randn(4, 2, 50, 32, generator=gen).to(dtype) for _ in range(2))
    base = AttentionCase.create(q, k, v, scale=32 ** -0.5, causal=causal)
    return serving_case(base, form="paged", packing=packing, pages="16", poison="huge", seed=3)


def test_the_reference_passes_at_every_split_count():
    assert resolve_kernel("torch:split-kv", device="cpu").spec.num_splits == SPLIT_COUNTS
    for causal in ("none", "bottom_right"):
        for packing in ("ragged", "empty_sequences", "single_tokens"):
            verdict = flashcheck.check("torch:split-kv", _case(causal, packing), device="cpu")
            assert verdict.ok, str(verdict)


def test_empty_splits_merged_into_nan_are_found_at_the_split_counts_that_leave_a_split_empty():
    case = _case()
    assert min(case.k_lens) >= 3  # 1, 2 and 3 splits are never empty here
    verdict = flashcheck.check("torch:split-kv~empty_split_nan", case, device="cpu", properties=())
    assert {f.kind for f in verdict.findings} == {"nonfinite"}, str(verdict)
    assert all(f.diagnosis.startswith(("num_splits=16", "num_splits=32")) for f in verdict.findings)


def test_partial_lse_in_base_2_is_over_the_budget_and_named():
    verdict = flashcheck.check("torch:split-kv~lse_base2", _case(), device="cpu", properties=())
    kinds = {f.kind for f in verdict.findings}
    assert {"over_budget", "lse"} <= kinds, str(verdict)
    assert any("matches an lse in log2" in f.diagnosis for f in verdict.findings if f.kind == "lse")


def test_a_promise_of_split_invariance_is_held_to_the_bits():
    kernel = resolve_kernel("torch:split-kv", device="cpu")
    promised = flashcheck.Kernel(kernel.fn, kernel.spec.replace(split_invariant=True), name="split-kv-invariant")
    verdict = flashcheck.check(promised, _case(dtype=torch.float32), device="cpu", properties=())
    assert verdict.findings and {f.kind for f in verdict.findings} == {"split_dependence"}, str(verdict)
    assert verdict.max_ratio <= 1  # every split count inside the budget: only the promise is broken


def test_each_split_count_names_itself_the_first_too():
    """A defect at every split count says so at each, so that the lines that agree print as one."""
    kernel = resolve_kernel("torch:split-kv", device="cpu")

    def off(*args, **kwargs):
        out, lse = kernel.fn(*args, **kwargs)
        return out * 1.5, lse

    verdict = flashcheck.check(flashcheck.Kernel(off, kernel.spec, name="split-kv-off"), _case(), device="cpu",
                               properties=())
    firsts = {f.diagnosis.split(":")[0] for f in verdict.findings}
    assert firsts == {f"num_splits={n}" for n in SPLIT_COUNTS}, str(verdict)
