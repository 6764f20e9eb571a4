"""FlashInfer's Triton two-state merge (flashinfer-python's ``flashinfer.triton.cascade.merge_state``) under
the Triton interpreter: right on states that saw keys, NaN for two empty states (its known defect, kept
visible; reports/flashinfer-merge-2026-12-05). Skipped where flashinfer-python is not installed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

import flashcheck

pytestmark = [pytest.mark.interpreter,
              pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None,
                                 reason="flashinfer-python is not installed (pip install flashinfer-python)")]


@pytest.fixture(scope="module")
def merge():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    try:
        from flashinfer_merge import merge
    finally:
        sys.path.pop(0)
    return merge


def test_two_empty_states_merge_into_nan(merge):
    out = torch.ones(2, 8)
    empty = torch.full((2,), -math.inf)
    v, s = merge(out, empty, out, empty)
    assert torch.isnan(v).all() and torch.isnan(s).all()
    live = torch.tensor([0.0, 3.0])  # the control: one live state gives its own out and lse
    v, s = merge(out, empty, 2 * out, live)
    assert torch.equal(v, 2 * out) and torch.equal(s, live)


def test_check_merge_finds_it_only_where_states_are_empty(merge):
    verdict = flashcheck.check_merge(merge, convention="pair", lse_base="2", dtype="fp16", cases=24, rows=4,
                                     head_dim=16)
    regimes = {f.regime.split()[0] for f in verdict.findings}
    assert verdict.status == "BUG" and regimes == {"empty_splits", "all_empty"}, str(verdict)
