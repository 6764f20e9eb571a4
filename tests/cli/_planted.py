"""Kernels for the CLI tests, importable as tests.cli._planted:NAME."""

import os
import sys

import torch

import flashcheck
from flashcheck.numerics.twin import Defect, Habits, Tiling, twin_attention
from tests._planted import wrong_scale_past

SPEC = dict(causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True, dv_equals_d=False,
            fully_masked_rows="zero", precision="flash")


@flashcheck.kernel(**SPEC)
def correct(q, k, v, *, scale, causal, attn_mask=None):
    return twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, tiling=Tiling(32, 32))


@flashcheck.kernel(**SPEC)
def tail_bug(q, k, v, *, scale, causal, attn_mask=None):
    """Rows past the first 32 get a slightly wrong scale: a tail-tile defect."""
    out, lse = correct(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return wrong_scale_past(out, 32, 1.01, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask), lse


@flashcheck.kernel(**SPEC)
def scale_bug(q, k, v, *, scale, causal, attn_mask=None):
    """Every row gets a slightly wrong scale: a bug that any case shows."""
    out, lse = correct(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    return wrong_scale_past(out, 0, 1.01, q, k, v, scale=scale, causal=causal, attn_mask=attn_mask), lse


@flashcheck.kernel(**SPEC)
def crashes(q, k, v, *, scale, causal, attn_mask=None):
    raise IndexError("tile index out of range")


def plain(q, k, v, *, scale, causal, attn_mask=None):
    """No spec: flashcheck tests it on the default spec only."""
    return correct(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


@flashcheck.kernel(**SPEC)
def always_out_of_memory(q, k, v, *, scale, causal, attn_mask=None):
    """Every case is skipped (raised by hand: the CPU has no CUDA allocator), so nothing is ever judged."""
    raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {q.shape[2] % 3} GiB")


@flashcheck.kernel(**SPEC)
def acc_not_rescaled(q, k, v, *, scale, causal, attn_mask=None):
    """The accumulator is not rescaled when the running max grows: the defect model acc_not_rescaled, bit for bit."""
    return twin_attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, tiling=Tiling(32, 32),
                          habits=Habits(defect=Defect(rescale_acc=False)))


def _in_defect_models() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith(os.path.join("flashcheck", "defects", "matching.py")):
            return True
        frame = frame.f_back
    return False


@flashcheck.kernel(**SPEC)
def dies_while_named(q, k, v, *, scale, causal, attn_mask=None):
    """acc_not_rescaled, whose process dies when the defect models run it (never while its cases are judged)."""
    if _in_defect_models():
        os._exit(3)
    return acc_not_rescaled(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
