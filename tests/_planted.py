"""A defect shared by the planted kernels of the CLI and robustness tests."""

from flashcheck.numerics.twin import twin_attention


def wrong_scale_past(out, row: int, factor: float, q, k, v, *, scale, causal, attn_mask=None):
    """``out`` with the rows from ``row`` on computed with the scale off by ``factor``: a tail defect."""
    if q.shape[2] <= row:
        return out
    bad, _ = twin_attention(q, k, v, scale=scale * factor, causal=causal, attn_mask=attn_mask)
    out = out.clone()
    out[:, :, row:] = bad[:, :, row:]
    return out


def first_catching_case(kernel, *, device: str = "cpu", cases: int = 40, judge=None, properties=(), **draw):
    """The index of the first of ``cases`` cases drawn for ``kernel`` (seed 0, ``draw`` the strategy's options) that
    ``judge(kernel, case)`` calls a BUG (default: the forward check with ``properties``, no envelope), or None."""
    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.judge.check import check

    if judge is None:
        def judge(k, case):
            return check(k, case, device=device, properties=properties, envelope=False)
    for index, recipe in enumerate(draw_recipes(cases, spec=kernel.spec, seed=0, **draw)):
        if judge(kernel, recipe.build()).status == "BUG":
            return index
    return None
