"""The reordering envelope runs the twin only as far as the verdict needs it."""

from __future__ import annotations

import torch

from flashcheck.inputs.case import AttentionCase
from flashcheck.judge.comparison import error_ratios
from flashcheck.judge.envelope import envelope_findings, reordering_envelope
from flashcheck.numerics.budget import error_budget
from flashcheck.numerics.twin import twin_attention


def _case(dtype=torch.float16, precision="flash"):
    gen = torch.Generator().manual_seed(5)
    q = (torch.randn(2, 3, 40, 16, generator=gen) * 2).to(dtype)
    k = (torch.randn(2, 3, 70, 16, generator=gen) * 2).to(dtype)
    v = torch.randn(2, 3, 70, 16, generator=gen).to(dtype)
    case = AttentionCase.create(q, k, v, scale=0.25, causal="bottom_right")
    budget = error_budget(q, k, v, scale=0.25, causal="bottom_right", precision=precision)
    return case, budget


def test_one_head_envelope_is_that_head_of_the_whole_envelope():
    case, budget = _case()
    whole = reordering_envelope(case, budget, device="cpu")
    heads = [reordering_envelope(case, budget, device="cpu", head=(b, h)) for b in range(2) for h in range(3)]
    assert max(heads) == whole  # rows are independent: the case's envelope is its worst head's
    assert min(heads) < whole


def test_the_envelope_stops_once_the_verdict_is_settled():
    case, budget = _case()
    whole = reordering_envelope(case, budget, device="cpu")
    first_run = reordering_envelope(case, budget, device="cpu", enough=1e-300)
    assert 0 < first_run <= whole


def test_an_outlier_on_one_head_is_still_suspicious():
    """The twin on the worst head alone cannot hide an outlier: only a head whose envelope settles
    the verdict ends the search early."""
    case, budget = _case(torch.float32, "strict")  # fp32 without tf32: legal reorderings stay far inside
    out, _ = twin_attention(case.q, case.k, case.v, scale=case.scale, causal=case.causal, precision="strict")
    ref = budget.reference
    # A systematic error inside the budget but far past any legal reordering, on head (1, 2) only.
    biased = ref.out.clone()
    biased[1, 2] += 0.5 * budget.total[1, 2]
    ratio, _ = error_ratios(biased, ref.out, budget.total, ref.empty_rows)
    max_ratio = float(ratio.max())
    assert 0.4 < max_ratio < 1
    found = envelope_findings(case, budget, max_ratio, device="cpu", out=biased.float())
    assert [f.kind for f in found] == ["reordering_outlier"]
    # The twin's own output is inside its envelope.
    twin_ratio = float(error_ratios(out.double(), ref.out, budget.total, ref.empty_rows)[0].max())
    assert envelope_findings(case, budget, twin_ratio, device="cpu", out=out) == []


def test_the_twin_skips_the_key_tiles_no_row_sees_and_no_bit_changes(monkeypatch):
    from flashcheck.features.variant import Variant
    from flashcheck.numerics import twin
    from flashcheck.numerics.twin import Tiling

    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 2, n, 16, generator=gen).half() for n in (9, 300, 300))
    padding = torch.arange(300).view(1, 1, 1, -1) < torch.tensor([120, 300]).view(2, 1, 1, 1)
    runs = [dict(variant=Variant(window=(20, 0)), causal="bottom_right"), dict(attn_mask=padding),
            dict(variant=Variant(chunk=64), causal="bottom_right"), dict(attn_mask=torch.zeros(1, 1, 9, 300).bool())]
    seen, every = [], []
    for kw in runs:
        for tiling in (Tiling(16, 16), Tiling(8, 32, key_order=torch.randperm(300, generator=gen))):
            seen.append(twin_attention(q, k, v, scale=0.25, precision="flash", tiling=tiling, **kw))
    seen_tiles = twin._seen_tiles(twin.visible("bottom_right", None, (2, 2, 9, 300), variant=Variant(window=(20, 0))),
                               16)
    assert seen_tiles == [256, 272, 288], seen_tiles  # windows of 21 keys ending at keys 291 to 299: keys 271 to 299
    monkeypatch.setattr(twin, "_seen_tiles", lambda vis, block_n: range(0, vis.shape[-1], block_n))
    gen.manual_seed(11)
    q, k, v = (torch.randn(2, 2, n, 16, generator=gen).half() for n in (9, 300, 300))
    for kw in runs:
        for tiling in (Tiling(16, 16), Tiling(8, 32, key_order=torch.randperm(300, generator=gen))):
            every.append(twin_attention(q, k, v, scale=0.25, precision="flash", tiling=tiling, **kw))
    for (out, lse), (out_all, lse_all) in zip(seen, every):
        assert torch.equal(out.float() + 0.0, out_all.float() + 0.0)  # + 0.0: the sign of a zero aside
        assert torch.equal(lse, lse_all)


def test_the_runs_go_fewest_key_tiles_first_and_their_order_changes_no_envelope(monkeypatch):
    """The runs stop at the first that reaches ``enough``; in any order the envelope reaches it or it does not, and a
    walk through them all gives the same worst, as long as the shuffled runs keep their order (which draws theirs)."""
    from flashcheck.judge import envelope

    runs = envelope.ENVELOPE_TILINGS
    assert [n for _, n, _ in runs] == sorted((n for _, n, _ in runs), reverse=True)
    case, budget = _case()
    whole = reordering_envelope(case, budget, device="cpu")
    monkeypatch.setattr(envelope, "ENVELOPE_TILINGS", (runs[3], runs[1], runs[0], runs[2]))  # the order before
    assert reordering_envelope(case, budget, device="cpu") == whole


def test_a_running_sum_is_a_legal_order_where_the_device_sums_in_a_tree(monkeypatch):
    """A CPU's BLAS sums each dot product one term at a time; a GPU's sums in a tree, whose roundings cancel where
    a running sum's add up (coherent P rounding). With the twin's matmuls exact, as a GPU's tree nearly is, a
    kernel with running sums (torch:math on the CPU) read as SUSPICIOUS at 10.7 times the envelope; found on an
    H100 by torch:block-sparse on an fp32 case of 364 keys (0.22 of the budget, the envelope 0.0154)."""
    from flashcheck import check
    from flashcheck.inputs.case import Shapes
    from flashcheck.inputs.recipe import Recipe
    from flashcheck.numerics import twin
    from flashcheck.numerics.blockwise import by_group

    monkeypatch.setattr(twin, "by_group", lambda a, b: by_group(a.double(), b.double()).float())
    recipe = Recipe(shapes=Shapes(1, 5, 1, 364, 364, 188, 2), dtype="fp32", values="coherent_p_rounding",
                    mask="none", causal="none", scale="default", layout="contiguous", seed=1)
    case = recipe.build(kernel="torch:math")
    verdict = check("torch:math", case, device="cpu", properties=(), envelope=True)
    assert verdict.status == "PASS" and verdict.max_ratio > 0.1, str(verdict)
    budget = error_budget(case.q, case.k, case.v, scale=case.scale, precision="upcast")
    tree, _ = twin_attention(case.q, case.k, case.v, scale=case.scale, precision="upcast")
    ref = budget.reference
    tree_ratio = float(error_ratios(tree.double(), ref.out, budget.total, ref.empty_rows)[0].max())
    assert tree_ratio * 8 < verdict.max_ratio  # the tree's twin alone would have called it SUSPICIOUS


def test_the_running_sum_twin_rounds_each_product_and_each_sum_to_fp32():
    import numpy as np

    from flashcheck.numerics.twin import Habits

    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 3, 5, generator=gen) for _ in range(3))
    out, _ = twin_attention(q, k, v, scale=1.0, precision="upcast", habits=Habits(sequential=True))
    x, y, w = (t.numpy() for t in (q, k, v))
    s = np.zeros((1, 2, 3, 3), np.float32)
    for i in range(5):
        s += x[..., i, None] * y[..., None, :, i]
    p = torch.exp(torch.from_numpy(s - s.max(-1, keepdims=True))).numpy()  # the twin's exp, not numpy's
    acc = np.zeros((1, 2, 3, 5), np.float32)
    for j in range(3):
        acc += p[..., j, None] * w[..., j, None, :]
    assert torch.equal(out, torch.from_numpy(acc / p.sum(-1, keepdims=True)))
