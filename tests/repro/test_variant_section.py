"""A reproducer's variant comes from flashcheck's features: each scalar keyword written as its feature writes it
(``softcap=math.inf``, ``chunk=3``), the features' code that the call and the exact answer need copied in, and
nothing else of theirs. On the CPU, where flex is correct, its script exits 0 with chunks, linear ALiBi, an
infinite cap and a window open on the left."""

from __future__ import annotations

import math

import torch

from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case, tensors


def test_flex_with_chunks_linear_alibi_and_an_infinite_cap(tmp_path):
    q, k, v = tensors(Hq=4, Hkv=2, Nq=6, Nk=11)
    variant = Variant(softcap=math.inf, window=(-1, 2), chunk=3, alibi="linear",
                      alibi_slopes=torch.rand(4, generator=torch.Generator().manual_seed(3)))
    case = AttentionCase.create(q, k, v, scale=0.4, causal="top_left", variant=variant)
    path, verdict = save_case(tmp_path / "corpus", "torch:flex[compile=False,alibi=linear]", case)
    assert verdict.status == "PASS", verdict
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0, printed + errors
    script = tmp_path / "out" / "repro.py"
    text = script.read_text()
    assert "KEYWORDS = dict(softcap=math.inf, window=(-1, 2), chunk=3)" in text and not imports_flashcheck(text)
    assert "def chunk_mask" in text and "def alibi_score" in text and "'linear'" in text
    assert "def attn_bias_bias" not in text and "def sdpa_call" not in text  # only what this case and call need
    run = run_without_flashcheck(script)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "out: every element within its budget" in run.stdout and "lse: every element within its budget" in run.stdout
