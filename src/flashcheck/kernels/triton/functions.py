"""Triton device functions the forward and backward kernels share, so that both compute the very same bits
(the backward recomputes the forward's capped and biased logits). Written at module level and jitted by the
kernels' loaders after :func:`bind` has given them the ``tl`` their source refers to, as the kernels are."""

from __future__ import annotations

__all__ = ["alibi_py", "bias_py", "bind", "tanh_py"]


def bind(tl_module) -> None:
    """Bind the global ``tl`` these functions' source uses (triton.language, imported on first use)."""
    globals()["tl"] = tl_module


def tanh_py(x):
    """tanh in fp32, finite for every x: (1 - e^-2|x|) / (1 + e^-2|x|), where e^-2|x| underflows to 0 and
    gives 1; below |x| = 0.25, where that form cancels to an absolute error, the odd Taylor series to x^9
    (its remainder under 2^-26 of tanh there)."""
    a = tl.abs(x)  # noqa: F821 - bound by bind()
    e = tl.math.exp2(a * -2.8853900817779268)  # noqa: F821
    b = tl.minimum(a, 0.25)  # noqa: F821 - the series only where it is taken: no overflow where it is not
    b2 = b * b
    small = b + b * b2 * (-0.3333333333333333 + b2 * (0.13333333333333333 + b2 * (-0.05396825396825397
                                                                              + b2 * 0.021869488536155203)))
    t = tl.where(a < 0.25, small, (1.0 - e) / (1.0 + e))  # noqa: F821
    return tl.where(x < 0, -t, t)  # noqa: F821


def alibi_py(pos, cols, slope2, LINEAR: tl.constexpr):  # noqa: F821
    """ALiBi of a tile in the base-2 domain, fp32: ``-slope2 |pos - j|`` (symmetric; pos = i + Nk - Nq, flash-
    attention's) or ``slope2 (j - pos)`` (linear; pos = i). The caller aligns ``pos`` and loads the slope."""
    d = (cols[None, :] - pos[:, None]).to(tl.float32)  # noqa: F821
    if LINEAR:
        return slope2 * d
    return -slope2 * tl.abs(d)  # noqa: F821


def bias_py(base, rows, cols, stride_r, stride_c, row_ok, col_ok):
    """An attn_bias tile in fp32 (whatever its dtype: an fp32 bias with fp16 inputs keeps its bits); out-of-range
    elements load as 0."""
    return tl.load(base + rows[:, None] * stride_r + cols[None, :] * stride_c,  # noqa: F821
                   mask=row_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32)  # noqa: F821
