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

    def __init__(self, kernel=tf._flash_attention_fwd, **jit_options):
        fn = jit.JITFunction(kernel, **jit_options)
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


def _variant_mixes(heads: int) -> list[dict]:
    """Every mix of the variants that add no tensor of their own to the launch: soft-cap, window, chunk,
    ALiBi and sinks (32 mixes)."""
    options = {"softcap": 2.0, "window": (4, 2), "chunk": 8, "alibi_slopes": torch.tensor([0.5, 0.25][:heads]),
               "sinks": torch.tensor([1.0, -2.0][:heads])}
    names = list(options)
    return [{n: options[n] for i, n in enumerate(names) if mask >> i & 1} for mask in range(1 << len(names))]


def test_every_mix_of_soft_cap_window_chunk_alibi_and_sinks_shares_one_forward_variant(monkeypatch):
    # As constexprs they compiled one variant per mix: 349 mixes of the dtype, head dims and flags in the
    # 2,800 cases of one dtype of the self-test's variants row.
    tf._load()
    recorder = Recorder(**tf._JIT_OPTIONS)
    monkeypatch.setitem(tf._JITTED, "kernel", recorder)
    q = torch.randn(1, 2, 24, 32, dtype=torch.float16)
    for mix in _variant_mixes(2):
        tf.triton_attention(q, q, q, scale=0.2, causal="bottom_right", **mix)
    assert len(recorder.keys) == 1


def test_every_mix_of_soft_cap_window_chunk_and_alibi_shares_one_backward_variant(monkeypatch):
    import flashcheck.kernels.triton.backward as tb
    from flashcheck.contract.validation import check_attention_inputs

    tb._load()
    recorders = {"dkdv": Recorder(tb._dkdv_kernel, **tb.jit_options(tb._dkdv_kernel)),
                 "dq": Recorder(tb._dq_kernel, **tb.jit_options(tb._dq_kernel))}
    for name, recorder in recorders.items():
        monkeypatch.setitem(tb._JITTED, name, recorder)
    monkeypatch.setattr(tb, "_PLANS", {})
    q = torch.randn(1, 2, 24, 32, dtype=torch.float16)
    *_, shapes = check_attention_inputs(q, q, q, scale=0.2, causal="bottom_right")
    out, lse = torch.zeros_like(q), torch.zeros(1, 2, 24)
    for mix in _variant_mixes(2):
        mix.pop("sinks", None)  # the sinks' gradient is the host's: the kernels never see them
        mix["window"] = mix["window"] if "window" in mix else None
        slopes = mix.pop("alibi_slopes", None)
        tb.triton_attention_backward(
            q, q, q, out, lse, out, scale=0.2, causal="bottom_right", attn_mask=None, shapes=shapes, block_m=16,
            block_n=16, block_d=32, block_dv=32, input_precision="ieee",
            alibi_slopes=None if slopes is None else slopes.expand(1, 2), **mix)
    assert [len(r.keys) for r in recorders.values()] == [1, 1]
