"""Two third-party defects found on an H100 (torch 2.11, Triton 3.6; reports/sparse-2026-12-06 and
reports/mla-2026-12-06), kept visible beside their controls:

- FlexAttention's compiled block-sparse path: a BlockMask of 64 x 64 blocks over 65 queries fails to compile
  (Inductor's NoValidChoicesError) when FlexAttention picks its tiles; with its tiles set to the blocks it runs.
- SGLang's Triton MLA decode at one query head on the K/V head rounds each q.k product to the input dtype: fp16
  products past 65,504 give NaN, where the same rows at two query heads (the grouped kernel) give a finite answer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

import flashcheck
from flashcheck.inputs.case import load_case
from tests.gpu._marks import COMPILED_TRITON

pytestmark = COMPILED_TRITON

REPORTS = Path(__file__).parents[2] / "reports"
FLEX_SHRUNK = REPORTS / "sparse-2026-12-06" / "h100-run3" / "cases" / \
    "torch-flex-block-sparse-q_block-64-kv_block-64-crash-shrunk-12d9bcca63.json"


def test_flex_block_lists_of_64_by_64_over_65_queries_do_not_compile():
    verdict = flashcheck.check("torch:flex-block-sparse[q_block=64,kv_block=64]", load_case(FLEX_SHRUNK),
                               device="cuda", properties=())
    assert verdict.status == "BUG" and [f.kind for f in verdict.findings] == ["crash"], str(verdict)
    assert "NoValidChoicesError" in verdict.findings[0].diagnosis, str(verdict)


def test_the_same_block_mask_compiles_with_the_tiles_set_to_the_blocks():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # benchmarks/flex_block_probe.py's call, which ran on the H100 (65 queries, 246 keys, causal)
    q, k, v = (torch.randn(1, 1, n, 16, device="cuda", dtype=torch.bfloat16) for n in (65, 246, 246))
    mask = create_block_mask(lambda b, h, i, j: j <= i, 1, 1, 65, 246, device="cuda", BLOCK_SIZE=(64, 64))
    out = torch.compile(flex_attention)(q, k, v, block_mask=mask, kernel_options={"BLOCK_M": 64, "BLOCK_N": 64})
    assert torch.isfinite(out).all()


def _sglang_decode(q, keys, scale):
    """SGLang's MLA decode of one request over ``keys`` (slot 0 its padding slot): (out, lse)."""
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

    heads, rank, splits = q.shape[0], 512, 8
    pool = torch.cat([keys.new_zeros(1, keys.shape[1]), keys])[:, None, :]
    out = torch.empty(1, heads, rank, dtype=q.dtype, device="cuda")
    logits = torch.empty(1, heads, splits, rank, dtype=torch.float32, device="cuda")
    lse = torch.full((1, heads, splits), -torch.inf, dtype=torch.float32, device="cuda")
    indptr = torch.tensor([0, keys.shape[0]], dtype=torch.int32, device="cuda")
    slots = torch.arange(1, keys.shape[0] + 1, dtype=torch.int64, device="cuda")
    decode_attention_fwd(q[None], pool, pool[..., :rank], out, indptr, slots, logits, lse,
                         torch.full((1,), splits, dtype=torch.int32, device="cuda"), splits, scale, 1.0, 1.0,
                         logit_cap=0.0, has_mla=True, page_size=1)
    return out[0], torch.logsumexp(lse[0], -1)


@pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed")
@pytest.mark.parametrize("heads, finite", [(1, False), (2, True)], ids=["ungrouped", "grouped"])
def test_sglang_rounds_each_product_to_fp16_at_one_query_head(heads, finite):
    q = torch.randn(1, 576, device="cuda")
    keys = torch.randn(1, 576, device="cuda")
    q[:, :16], keys[:, :16] = 300.0, 300.0  # products of 90,000, past fp16's 65,504; the logit fits fp32
    out, lse = _sglang_decode(q.half().expand(heads, 576).contiguous(), keys.half(), 192 ** -0.5)
    assert bool(torch.isfinite(out).all() and torch.isfinite(lse).all()) == finite
