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


def assert_listed(name: str, bugs) -> None:
    """``flashcheck kernels`` lists the kernel ``name`` with its planted ``bugs``, in order."""
    import contextlib
    import io

    from flashcheck.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["kernels"]) == 0
    listing = " ".join(line.strip() for line in out.getvalue().splitlines())
    assert f"planted bugs ({name}~NAME): {', '.join(bug.name for bug in bugs)}" in listing, listing


def assert_passes_drawn(kernel, cases: int, *, seed: int, judge=None, dtypes=("fp16", "fp32"), **draw) -> None:
    """``cases`` cases drawn for ``kernel`` in every one of ``dtypes`` each PASS ``judge(kernel, case)`` (default:
    the forward check on the CPU, no property)."""
    from flashcheck.inputs.recipe_draws import draw_recipes
    from flashcheck.judge.check import check

    if judge is None:
        def judge(k, case):
            return check(k, case, device="cpu", properties=())
    drawn = draw_recipes(cases, spec=kernel.spec, seed=seed, dtypes=list(dtypes), **draw)
    assert {r.dtype for r in drawn} == set(dtypes)
    for recipe in drawn:
        verdict = judge(kernel, recipe.build())
        assert verdict.status == "PASS", str(verdict)


def backward_judge(kernel, case):
    """The backward check of ``case`` on the CPU, as ``first_catching_case`` and ``assert_passes_drawn`` take it."""
    from flashcheck.judge.backward import check_backward

    return check_backward(kernel, case, device="cpu")
