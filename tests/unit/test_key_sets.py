"""Sparse index sets (spec ``key_sets``): the convention's declarations refused by name, the visible set read from
the convention (against a brute force written here, key by key), the oracle audited by mpmath on every regime,
torch:sparse within the budget, each planted misread of the lists caught within 40 cases, a saved case replayed, and
what the properties and the reproducer make of the lists."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import flashcheck
from flashcheck import InvalidArgument, KernelSpec, KeySets, Variant
from flashcheck.contract.validation import Shapes
from flashcheck.features.key_sets import FEATURE, key_counts
from flashcheck.inputs.case import load_case
from flashcheck.inputs.recipe import Recipe
from flashcheck.inputs.recipe_draws import draw_recipes
from flashcheck.judge.check import check
from flashcheck.judge.envelope import reordering_envelope
from flashcheck.kernels.planted import SPARSE
from flashcheck.kernels.registry import resolve_kernel
from flashcheck.numerics.audit import audit_reference
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.oracle import reference_attention
from flashcheck.repro.calls import kernel_call

from tests._planted import first_catching_case

REGIMES = [r for r in FEATURE.regimes if r != "none"]


# ---- the convention ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields, argument", [
    ({"duplicates": "thrice"}, "duplicates"),
    ({"past_end": "clamped"}, "past_end"),
    ({"padding": "first"}, "padding"),
    ({"order_invariant": "yes"}, "order_invariant"),
])
def test_a_wrong_declaration_names_its_field(fields, argument):
    with pytest.raises(InvalidArgument) as raised:
        KernelSpec(key_sets=fields)
    assert raised.value.argument == argument and "KeySets" in str(raised.value)


def test_key_sets_true_is_the_default_convention():
    spec = KernelSpec(key_sets=True)
    assert spec.key_sets == KeySets("once", "masked", "anywhere", False, True)
    with pytest.raises(InvalidArgument) as raised:
        KernelSpec(key_sets="topk")
    assert raised.value.argument == "key_sets"


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(2, 3, dtype=torch.int32), "4 dims"),
    (torch.full((1, 1, 2, 3), -2, dtype=torch.int32), "below -1"),
    (torch.zeros(1, 1, 2, 3), "integer"),
])
def test_bad_indices_are_refused_by_name(bad, words):
    with pytest.raises(InvalidArgument) as raised:
        Variant(indices=bad)
    assert raised.value.argument == "indices" and words in str(raised.value)


def test_indices_of_the_wrong_shape_are_refused():
    case = Recipe(Shapes(1, 4, 2, 3, 9, 16, 16), "fp32", seed=0).build()
    variant = Variant(indices=torch.zeros(1, 3, 3, 2, dtype=torch.int32))  # 3 lists where Hkv is 2
    with pytest.raises(InvalidArgument) as raised:
        check("torch:sparse", dataclasses.replace(case, variant=variant), device="cpu")
    assert raised.value.argument == "indices"


# ---- the visible set, from the convention ------------------------------------------------------------------------


def _brute_force(indices, causal, n_q, n_k, heads_q):
    """(B, Hq, Nq, Nk) visible keys, one list entry at a time: -1 and indices past the keys name none."""
    B, Hs = indices.shape[:2]
    out = torch.zeros(B, heads_q, n_q, n_k, dtype=torch.bool)
    for b in range(B):
        for h in range(heads_q):
            for i in range(n_q):
                for j in indices[b, h * Hs // heads_q, i].tolist():
                    last = {"none": n_k - 1, "top_left": i, "bottom_right": i + n_k - n_q}[causal]
                    if 0 <= j < n_k and j <= last:
                        out[b, h, i, j] = True
    return out


@pytest.mark.parametrize("regime", REGIMES)
def test_the_visible_keys_are_the_listed_ones(regime):
    s = Shapes(2, 4, 2, 5, 11, 8, 8)
    causal = "bottom_right" if regime != "one_key" else "none"
    case = Recipe(s, "fp32", seed=3, causal=causal, variants={"indices": regime}).build()
    got = case.visible()
    want = _brute_force(case.variant.indices, causal, s.n_q, s.n_k, s.heads_q)
    assert torch.equal(got, want)
    ref = reference_attention(case.q, case.k, case.v, scale=case.scale, causal=causal, variant=case.variant)
    assert torch.equal(ref.empty_rows, ~want.any(-1))


def test_counts_name_each_key_as_often_as_listed():
    idx = torch.tensor([[[[3, -1, 3, 0, 7, 99]]]], dtype=torch.int32)
    assert key_counts(idx, 5).tolist() == [[[[1, 0, 0, 2, 0]]]]


@pytest.mark.parametrize("regime", REGIMES)
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_the_oracle_is_audited_by_mpmath(regime, dtype):
    case = Recipe(Shapes(1, 2, 1, 3, 13, 8, 8), dtype, seed=11, values="huge_logits", causal="top_left",
                  variants={"indices": regime}).build()
    audit = audit_reference(case.q, case.k, case.v, scale=case.scale, causal=case.causal, variant=case.variant,
                            dps=40)
    assert audit.ok, audit


# ---- the reference and its planted bugs ---------------------------------------------------------------------------


def test_torch_sparse_passes_its_own_cases():
    kernel = resolve_kernel("torch:sparse", device="cpu")
    worst = 0.0
    for recipe in draw_recipes(30, spec=kernel.spec, seed=2, max_n=48):
        verdict = check(kernel, recipe.build(), device="cpu", properties=())
        assert verdict.status == "PASS", verdict
        worst = max(worst, verdict.max_ratio)
    assert 0.0 < worst <= 1.0


@pytest.mark.parametrize("bug", [b.name for b in SPARSE])
def test_each_misread_of_the_lists_is_caught_within_40_cases(bug):
    kernel = resolve_kernel(f"torch:sparse~{bug}", device="cpu")
    assert first_catching_case(kernel, max_n=48) is not None, f"{kernel.name} passed 40 cases"


def test_a_saved_case_replays_to_its_verdict(tmp_path):
    buggy = resolve_kernel("torch:sparse~padding_reads_key0", device="cpu")
    recipe = Recipe(Shapes(1, 2, 2, 3, 12, 8, 8), "fp16", seed=4, variants={"indices": "padded"})
    case = recipe.build(kernel=buggy.name)
    first = check(buggy, case, device="cpu", properties=())
    assert first.status == "BUG"
    case.save(tmp_path / "sparse")
    loaded = load_case(tmp_path / "sparse.json")
    assert torch.equal(loaded.variant.indices, case.variant.indices) and loaded.variant.indices.dtype == torch.int32
    again = check(buggy, loaded, device="cpu", properties=())
    assert again.status == "BUG" and again.max_ratio == first.max_ratio
    assert check("torch:sparse", loaded, device="cpu", properties=()).status == "PASS"


def test_keys_no_list_names_are_poisoned_with_nan():
    """A gather never reads a key no list names: poisoning it with NaN changes no bit of torch:sparse."""
    case = Recipe(Shapes(1, 2, 1, 3, 40, 8, 8), "fp32", seed=1, variants={"indices": "last_keys"}).build()
    verdict = check("torch:sparse", case, device="cpu", properties=("poison",))
    assert verdict.status == "PASS" and "poison" in verdict.properties, verdict


def test_a_kernel_that_reads_unlisted_keys_is_caught_by_the_poison():
    """A kernel that computes the dense scores and masks them after reads every key: 0 * NaN shows."""
    import flashcheck

    @flashcheck.kernel(key_sets=True, dtypes=("fp32",), fully_masked_rows="any", nan_safe_masking=True)
    def dense_then_masked(q, k, v, *, scale, causal, attn_mask=None, indices):
        counts = key_counts(indices, k.shape[2]) > 0
        s = (q @ k.transpose(-1, -2) * scale).masked_fill(~counts, -math.inf)
        return torch.softmax(s, -1).nan_to_num() @ v

    case = Recipe(Shapes(1, 1, 1, 2, 40, 8, 8), "fp32", seed=1, variants={"indices": "last_keys"}).build()
    verdict = check(dense_then_masked, case, device="cpu", properties=("poison",))
    assert verdict.status == "BUG" and any(f.kind == "poison_leak" for f in verdict.findings), verdict


def test_a_reproducer_of_keys_weighed_without_code_that_counts_them_is_refused_by_name(tmp_path, monkeypatch):
    """A case counted twice gets a script (tests/repro/test_sparse_repro.py), since the index sets' script code
    counts repeats; a key restriction that weighs its keys without such code is refused, not written wrong."""
    @flashcheck.kernel(key_sets=KeySets(duplicates="twice"))
    def user(q, k, v, *, scale, causal, attn_mask=None, indices):
        raise AssertionError("never called")

    unweighed = dataclasses.replace(FEATURE, script={"mask_mod": FEATURE.script["mask_mod"]})
    monkeypatch.setattr(Variant, "biasing", lambda self: (unweighed,))
    with pytest.raises(InvalidArgument) as raised:
        kernel_call(user, _twice_case(), device="cpu", case_path=tmp_path / "case.json")
    assert raised.value.argument == "case" and "weighs keys by how often they are listed" in str(raised.value)
    assert "case.json" in str(raised.value) and "flashcheck replay" in str(raised.value)


def _promising_order_invariance():
    import flashcheck

    base = resolve_kernel("torch:sparse", device="cpu")
    spec = dataclasses.replace(base.spec, key_sets=KeySets(order_invariant=True))
    return flashcheck.Kernel(base.fn, spec, name="sparse-promising-order")


def test_a_permuted_list_within_the_budget_is_a_note_unless_order_invariance_is_promised():
    """torch:sparse sums a row in its list's order: a permuted list gives other bits, legal unless promised."""
    case = Recipe(Shapes(1, 2, 1, 4, 200, 16, 16), "fp32", seed=1, variants={"indices": "sampled"}).build()
    verdict = check("torch:sparse", case, device="cpu", properties=("reorder",))
    assert verdict.status == "PASS" and verdict.properties == ["reorder"]
    assert any("order-dependent" in note for note in verdict.notes), verdict.notes
    promised = check(_promising_order_invariance(), case, device="cpu", properties=("reorder",))
    assert promised.status == "BUG" and [f.kind for f in promised.findings] == ["order_dependence"], promised


# ---- the backward pass -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("regime", ["duplicates", "padding_first", "one_key", "over_keys"])
def test_the_gradients_are_audited_by_mpmath(regime):
    """A key chosen by several queries gathers its dK and dV from each of them: the float64 gradients' bounds hold
    against mpmath."""
    from flashcheck.inputs.regimes import make_upstream
    from flashcheck.numerics.gradients import audit_gradients

    case = Recipe(Shapes(1, 2, 1, 4, 9, 8, 8), "fp16", seed=7, causal="bottom_right",
                  variants={"indices": regime}).build()
    kw = dict(scale=case.scale, causal=case.causal, variant=case.variant)
    out = reference_attention(case.q, case.k, case.v, **kw).out
    do = make_upstream("aligned", out=out, dtype=case.q.dtype, seed=3)
    audit = audit_gradients(case.q, case.k, case.v, do, dps=30, **kw)
    assert audit.ok, audit


def test_torch_sparse_gradients_stay_within_the_budget():
    from flashcheck.judge.backward import check_backward

    kernel = resolve_kernel("torch:sparse", device="cpu")
    for recipe in draw_recipes(12, spec=kernel.spec, seed=5, max_n=32):
        verdict = check_backward(kernel, recipe.build(), device="cpu")
        assert verdict.status == "PASS" or verdict.skipped, verdict


# ---- duplicates counted twice ------------------------------------------------------------------------------------


def _twice_case(seed=2, dtype="fp32", regime="duplicates"):
    return Recipe(Shapes(1, 4, 2, 3, 21, 8, 8), dtype, seed=seed, causal="bottom_right",
                  variants={"indices": regime}, settings={"duplicates": "twice"}).build()


def test_under_twice_the_oracle_weighs_a_key_as_often_as_listed():
    """Against a float64 gather written here: every listed entry (not -1, not past the keys, not past the causal
    diagonal) is one term of the softmax, repeats included."""
    case = _twice_case()
    assert case.variant.duplicates == "twice" and case.variant.indices.shape[1] == 1
    q, k, v = (t.double() for t in (case.q, case.k, case.v))
    s = case.shapes
    want = torch.zeros(s.batch, s.heads_q, s.n_q, s.head_dim_v, dtype=torch.float64)
    for h in range(s.heads_q):
        for i in range(s.n_q):
            keys = [j for j in case.variant.indices[0, 0, i].tolist() if 0 <= j <= i + s.n_k - s.n_q]
            if keys:
                logits = torch.stack([q[0, h, i] @ k[0, h // s.group, j] for j in keys]) * case.scale
                want[0, h, i] = torch.softmax(logits, 0) @ v[0, h // s.group, keys]
    ref = reference_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal, variant=case.variant)
    assert torch.allclose(ref.out.nan_to_num(), want, rtol=1e-12, atol=1e-13)
    assert bool((key_counts(case.variant.indices, s.n_k) > 1).any())  # the case repeats keys


def test_under_twice_the_audit_holds_and_a_deduplicating_kernel_is_caught():
    case = _twice_case(dtype="fp16")
    audit = audit_reference(case.q, case.k, case.v, scale=case.scale, causal=case.causal, variant=case.variant, dps=30)
    assert audit.ok, audit
    assert check("torch:sparse[duplicates=twice]", case, device="cpu").status == "PASS"
    once = resolve_kernel("torch:sparse", device="cpu")
    claims_twice = flashcheck.Kernel(once.fn, dataclasses.replace(once.spec, key_sets=KeySets(duplicates="twice")),
                                     name="dedups-declares-twice")
    assert check(claims_twice, case, device="cpu", properties=()).status == "BUG"
    with pytest.raises(InvalidArgument) as raised:  # a case counted twice, a kernel that counts once
        check(once, case, device="cpu")
    assert "duplicates" in str(raised.value)


def test_twice_weighs_one_list_for_every_head():
    with pytest.raises(InvalidArgument) as raised:
        Variant(indices=torch.zeros(1, 2, 3, 4, dtype=torch.int32), duplicates="twice")
    assert raised.value.argument == "indices" and "(B, 1, Nq, topk)" in str(raised.value)


def test_under_twice_the_envelope_holds_a_gathering_kernels_repeated_terms():
    """One key listed three times: a gathering kernel sums v three times and divides by 3, rounding in fp32 where
    the oracle is exact; the twin's legal orders sum the repeats too, so the kernel is no reordering outlier."""
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 64, 24, generator=gen) for _ in range(3))
    k, v = k[:, :, :1], v[:, :, :1]
    indices = torch.zeros(1, 1, 64, 3, dtype=torch.int32)
    case = flashcheck.AttentionCase(q, k, v, scale=0.2, variant=Variant(indices=indices, duplicates="twice"))
    budget = error_budget(case.q, case.k, case.v, scale=case.scale, variant=case.variant, precision="upcast")
    assert reordering_envelope(case, budget, device="cpu") > 0
    verdict = check("torch:sparse[duplicates=twice]", case, device="cpu")
    assert verdict.status == "PASS" and verdict.max_ratio > 0, verdict


# ---- near ties at the top-k boundary ------------------------------------------------------------------------------


def _near_ties_case(seed, dtype="fp16", values="random", causal="none"):
    return Recipe(Shapes(2, 4, 2, 6, 40, 16, 16), dtype, seed=seed, values=values, causal=causal,
                  variants={"indices": "near_ties"}).build()


def _boundary_gaps(case):
    """Per row of each list (on the query head its list was chosen on): the best unlisted key's exact logit less the
    worst listed key's, and the dtype's resolution of those two logits (its eps times the larger sum of |scale q_d
    k_d| over d)."""
    indices = case.variant.indices.long()
    lists = torch.arange(indices.shape[1])
    q = case.q[:, lists * (case.shapes.heads_q // case.shapes.heads_kv)].double()
    k = case.k[:, lists].double()
    s = q @ k.transpose(-1, -2) * case.scale
    sizes = (q.abs() @ k.abs().transpose(-1, -2)) * abs(case.scale)
    listed = key_counts(indices, case.shapes.n_k) > 0
    worst = s.masked_fill(~listed, math.inf).argmin(-1, keepdim=True)
    best = s.masked_fill(listed, -math.inf).argmax(-1, keepdim=True)
    gap = s.gather(-1, best) - s.gather(-1, worst)
    eps = torch.finfo(case.q.dtype).eps
    return gap.flatten(), eps * torch.maximum(sizes.gather(-1, best), sizes.gather(-1, worst)).flatten()


@pytest.mark.parametrize("dtype", ["fp16", "bf16", "fp32"])
def test_near_ties_list_the_top_k_up_to_a_tie_in_the_input_dtype(dtype):
    """Every row lists its best keys by the exact logits, and its boundary is a tie: the best key left out scores as
    high as the worst one listed (exactly, or within the dtype's resolution of the two logits, where it scores
    higher: a kernel that re-derives the set from its scores picks it)."""
    gaps, resolutions = zip(*(_boundary_gaps(_near_ties_case(seed, dtype, values))
                              for seed in range(6) for values in ("random", "huge_logits")))
    gap, resolution = torch.cat(gaps), torch.cat(resolutions)
    assert bool((gap >= 0).all()) and bool((gap <= resolution).all()), (gap / resolution).max()
    assert bool((gap == 0).any()) and bool((gap > 0).any())  # exact ties and one-ulp ties both drawn


def test_near_ties_are_drawn_and_counted_for_a_key_set_kernel_in_a_float_dtype():
    from flashcheck.inputs.covering import empty_coverage
    from flashcheck.inputs.recipe_draws import recipe_pools

    kernel = resolve_kernel("torch:sparse", device="cpu")
    drawn = {r.variants.get("indices") for r in draw_recipes(60, spec=kernel.spec, seed=1, max_n=48)}
    assert "near_ties" in drawn
    assert "near_ties" in empty_coverage(recipe_pools(spec=kernel.spec))["indices"]
    assert FEATURE.settings(kernel.spec, "fp8_e4m3", "near_ties", lambda options: options[0]) is None


@flashcheck.kernel(key_sets=True, dtypes=("fp16", "bf16", "fp32"))
def _recomputes_top_k(q, k, v, *, scale, causal, attn_mask=None, indices):
    """Attends the top-n keys of its own fp32 scores, n the count its list holds: the list's keys are never read."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.repeat_interleave(group, 1).float() for t in (k, v))
    s = q.float() @ k.transpose(-1, -2) * scale
    count = (indices >= 0).sum(-1, keepdim=True)
    count = count.repeat_interleave(q.shape[1] // count.shape[1], 1)
    keep = s.argsort(dim=-1, descending=True, stable=True).argsort(-1) < count
    return (torch.softmax(s.masked_fill(~keep, -math.inf), -1) @ v).to(q.dtype)


def test_a_kernel_that_recomputes_the_top_k_is_caught_on_near_ties_and_torch_sparse_passes():
    """Measured: caught on each of these 6 cases, at 52 to 5106 times its budget."""
    for seed in range(6):
        case = _near_ties_case(seed, dtype=("fp16", "bf16", "fp32")[seed % 3])
        assert check("torch:sparse", case, device="cpu", properties=()).status == "PASS"
        verdict = check(_recomputes_top_k, case, device="cpu", properties=())
        assert verdict.status == "BUG", (seed, verdict)


def test_near_ties_in_a_quantized_dtype_is_refused_by_name():
    """The regime is drawn only in fp16, bf16 and fp32; a recipe built by hand in fp8 gets a named error."""
    with pytest.raises(InvalidArgument, match="dtype='float8_e4m3fn'.*near_ties"):
        _near_ties_case(0, dtype="fp8_e4m3")
