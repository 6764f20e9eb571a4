"""flashcheck:triton compiles few variants: sizes and strides are not specialised on; the interpreter compiles none.

Triton decides what to compile from the specialisation of a launch's arguments. These tests compute that
specialisation with Triton's own function on the arguments flashcheck:triton launches with, so they run
without a GPU; tests/gpu counts real compilations.
"""

from __future__ import annotations

import pytest
import torch

import flashcheck.kernels.triton.forward as tf
from flashcheck import AttentionCase, check
from flashcheck.kernels.triton.cache import compilation_stats, watch_compilations

jit = pytest.importorskip("triton.runtime.jit")
compiler = pytest.importorskip("triton.backends.compiler")


class Recorder:
    """Stands in for the jitted kernel and keeps each launch's specialisation instead of running it."""

    def __init__(self, **jit_options):
        fn = jit.JITFunction(tf._flash_attention_fwd, **jit_options)
        if not hasattr(jit, "create_function_from_signature"):
            pytest.skip("this Triton computes specialisations another way")
        self.binder = jit.create_function_from_signature(fn.signature, fn.params, compiler.BaseBackend)
        self.keys = set()

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.keys.add(str(self.binder(*args, **meta)[1]))

        return launch


def layouts(t: torch.Tensor) -> list:
    """The same numbers as contiguous, transposed (B, N, H, D) and row-padded storage."""
    transposed = t.transpose(1, 2).contiguous().transpose(1, 2)
    padded = torch.zeros(*t.shape[:-1], t.shape[-1] + 8, dtype=t.dtype)[..., : t.shape[-1]]
    padded.copy_(t)
    return [t, transposed, padded]


def launch_variants(monkeypatch, **jit_options) -> int:
    """Distinct specialisations over lengths 1..100, GQA and three layouts, one dtype and tiling."""
    tf._load()
    recorder = Recorder(**jit_options)
    monkeypatch.setitem(tf._JITTED, "kernel", recorder)
    for B, Hq, Hkv, Nq, Nk in [(1, 1, 1, 1, 1), (2, 4, 2, 15, 17), (1, 2, 1, 16, 33), (3, 3, 3, 100, 64)]:
        q, k, v = (torch.randn(B, H, N, 32, dtype=torch.float16) for H, N in ((Hq, Nq), (Hkv, Nk), (Hkv, Nk)))
        for q_, k_, v_ in zip(layouts(q), layouts(k), layouts(v)):
            tf.triton_attention(q_, k_, v_, scale=0.2, causal="none")
    return len(recorder.keys)


def test_lengths_and_layouts_share_one_variant(monkeypatch):
    assert launch_variants(monkeypatch, **tf._JIT_OPTIONS) == 1
    # What Triton's default specialisation would cost on the same launches:
    assert launch_variants(monkeypatch) > 5


def test_the_interpreter_compiles_nothing():
    assert watch_compilations()  # this Triton has the hooks: a count of 0 means nothing was compiled
    before = compilation_stats()
    q = torch.randn(1, 2, 40, 16)
    verdict = check("flashcheck:triton", AttentionCase.create(q, q, q, scale=0.25), device="cpu")
    assert verdict.status == "PASS" and verdict.compilations == 0 and verdict.elapsed["compile"] == 0.0
    assert compilation_stats() == before
