"""A user's MLA decode kernel, written against the documented convention (docs/serving.md, "Multi-head latent
attention") with torch alone: the correct one passes a short CPU campaign, and two kernels with a classic mistake
(the scale of the 576-wide row, V read from the wrong columns) are found."""

from __future__ import annotations

import math

import pytest
import torch

import flashcheck
from flashcheck.strategies import draw_recipes

LATENT = 512


def _decode(q, kv, scale, causal, values):
    """q (B, Hq, Nq, 576) against the cached rows kv (B, 1, Nk, 576), V = ``values(kv)``."""
    rows = kv[:, 0].float()
    logits = torch.einsum("bhqd,bkd->bhqk", q.float(), rows) * scale
    n_q, n_k = logits.shape[-2:]
    if causal == "bottom_right":
        hidden = torch.ones(n_q, n_k, dtype=torch.bool).triu(n_k - n_q + 1)
        logits = logits.masked_fill(hidden, -math.inf)
    weights = torch.softmax(logits, dim=-1)
    return torch.einsum("bhqk,bkd->bhqd", weights, values(rows)).to(q.dtype)


SPEC = dict(mla=True, causal=("none", "bottom_right"), fully_masked_rows="any", devices=("cpu",))


@flashcheck.kernel(**SPEC)
def mla_decode(q, kv, *, scale, causal, attn_mask=None):
    return _decode(q, kv, scale, causal, lambda rows: rows[..., :LATENT])


@flashcheck.kernel(**SPEC)
def mla_decode_row_scale(q, kv, *, scale, causal, attn_mask=None):
    return _decode(q, kv, q.shape[-1] ** -0.5, causal, lambda rows: rows[..., :LATENT])


@flashcheck.kernel(**SPEC)
def mla_decode_rope_values(q, kv, *, scale, causal, attn_mask=None):
    return _decode(q, kv, scale, causal, lambda rows: rows[..., -LATENT:])


def _verdicts(kernel, count: int, **check_options):
    for recipe in draw_recipes(count, spec=kernel.spec, seed=7, max_n=48):
        yield flashcheck.check(kernel, recipe.build(), device="cpu", **check_options)


def test_a_correct_decode_kernel_passes_a_short_campaign():
    verdicts = list(_verdicts(mla_decode, 10))
    assert [v.status for v in verdicts] == [flashcheck.PASS] * 10, [str(v) for v in verdicts if not v.ok]
    assert any(v.properties for v in verdicts)  # the exact properties ran too


@pytest.mark.parametrize("kernel", [mla_decode_row_scale, mla_decode_rope_values], ids=lambda k: k.name)
def test_a_decode_kernel_that_misreads_the_row_is_found(kernel):
    assert any(v.status == flashcheck.BUG for v in _verdicts(kernel, 40, properties=(), envelope=False))
