"""flash-linear-attention's softmax attention (fla-core's ``fla.ops.attn.parallel.parallel_attn``) as a
flashcheck kernel (``fla:parallel_attn``), a real third-party Triton kernel with windows and sinks.

fla's conventions, mapped onto flashcheck's:
- always causal with Nq == Nk (so top-left and bottom-right agree); layout (B, T, H, D), a transposed view;
- ``window_size=w``: query i sees keys ``[i - w + 1, i]``, i.e. flashcheck's ``window=(w - 1, right)`` for
  any right (the causal mask cuts the right side at 0); ``window=(-1, right)`` is no window;
- ``sink_bias`` (HQ,): ``exp(sink_bias[h])`` added to each row's denominator, flashcheck's ``sinks``;
- returns the output only (no lse); autograd differentiates it (its own Triton backward).

Its backward rounds dS = P (dP - D) to the input dtype before the dQ and dK matmuls, as FA2 does: where
the exact |dS| passes fp16's 65,504 (large dO), dQ comes out NaN and dK infinite while the exact gradients
are finite (found by a CPU campaign under the Triton interpreter, fla-core 0.6.0; the shrunk case is in
reports/variants-2026-12-01/fla-cpu/). The spec keeps that class (``ds_past_range``) out of backward
campaigns; tests/interpreter/test_fla.py keeps it visible.

``pip install fla-core==0.6.0`` (1 MB, pure Triton, needs einops). On the CPU it runs under the Triton
interpreter (``TRITON_INTERPRET=1`` before triton is imported), where, as for every Triton kernel there, bf16
is left out (:func:`flashcheck.kernels.triton.runtime.triton_dtypes`).
"""

from __future__ import annotations

import importlib.util
import itertools
import os

import torch

from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .adapters import import_backend, validated_call
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON
from .triton.runtime import triton_dtypes

__all__ = ["NAME", "VARLEN_NAME", "DECODING_NAME", "DESCRIPTION", "make_fla_kernel", "make_fla_decoding_kernel",
           "decoding_spec"]

NAME = "fla:parallel_attn"
VARLEN_NAME = "fla:parallel_attn-varlen"
DECODING_NAME = "fla:attn_decoding"
DESCRIPTION = "flash-linear-attention's Triton softmax attention (fla-core's parallel_attn: causal, window, sinks)"


def unavailable(device: str, name: str = NAME) -> BackendUnavailable | None:
    """Why fla's kernel ``name`` cannot run on ``device``, without importing fla (that jits its kernels,
    which fixes Triton's choice between compiling and interpreting); None if it can."""
    if device == "cuda" and not torch.cuda.is_available():
        return BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if importlib.util.find_spec("fla") is None:
        return BackendUnavailable(name, device, "fla-core is not installed", "pip install fla-core==0.6.0 einops")
    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        return BackendUnavailable(name, "cpu", "fla's Triton kernels run on the CPU only under the Triton interpreter",
                                  "Set TRITON_INTERPRET=1 before Python starts (flashcheck's --device cpu does).")
    return None


def _parallel_attn():
    return import_backend(NAME, "fla.ops.attn.parallel", problem="fla-core is not installed",
                          fix="pip install fla-core==0.6.0 einops").parallel_attn


def _varlen(parallel_attn):
    """fla's varlen call: the packed batch as a batch of one with ``cu_seqlens`` (one set: each sequence's queries
    are its keys)."""

    # The convention's other keywords (cu_seqlens_q, the max lengths, causal) say nothing fla's call takes.
    def attention(q, k, v, *, cu_seqlens_k, scale, window=None, sinks=None, **convention):
        left = -1 if window is None else window[0]
        out = parallel_attn(q[None], k[None], v[None], scale=scale, window_size=None if left < 0 else left + 1,
                            sink_bias=sinks, cu_seqlens=cu_seqlens_k.long())
        return out[0]

    return attention


def _decoding(one_step):
    """fla's decoding step on a packed batch: query i of a sequence with q_len queries and k_len keys is the one
    query at the end of its first k_len - q_len + i + 1 keys (bottom-right causal), one call per query offset
    over the sequences that have it (their key prefixes packed with fla's ``cu_seqlens``)."""

    # The convention's other keywords (the max lengths; causal, always bottom-right here) change nothing.
    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, scale, window=None, sinks=None, **convention):
        out = q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
        q_at, k_at = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        q_lens, k_lens = ([b - a for a, b in zip(at, at[1:])] for at in (q_at, k_at))
        left = -1 if window is None else window[0]
        for i in range(max(q_lens, default=0)):
            ends = {s: k_lens[s] - q_lens[s] + i + 1 for s in range(len(q_lens)) if q_lens[s] > i}
            ends = {s: n for s, n in ends.items() if n > 0}  # a query that sees no key stays 0
            if not ends:
                continue
            keys, values = (torch.cat([t[k_at[s]:k_at[s] + n] for s, n in ends.items()]) for t in (k, v))
            cu = torch.tensor([0, *itertools.accumulate(ends.values())], device=q.device)
            rows = torch.tensor([q_at[s] + i for s in ends], device=q.device)
            o = one_step(q[rows][None], keys[None], values[None], scale=scale, cu_seqlens=cu,
                         window_size=None if left < 0 else left + 1, sink_bias=sinks)
            out[rows] = o[0]
        return out

    return attention


def decoding_spec(device: str) -> KernelSpec:
    """The spec of ``fla:attn_decoding``: bottom-right causal, ragged lengths, fp32 only. Its kernel sums each
    score in the input's dtype (``tl.sum`` keeps fp16 and bf16), which puts half precision over the flash
    contract's budget (reports/serving-2026-12-03); tests keep that visible, campaigns draw fp32."""
    return _spec(device).replace(form="varlen", backward=False, backward_excludes=(), dtypes=("fp32",),
                                 causal=("bottom_right",), equal_lengths=False, excludes=("bottom_right_more_queries",))


def make_fla_decoding_kernel(*, device: str = "cuda") -> Kernel:
    """fla-core's ``attn_decoding_one_step`` on the varlen form (bottom-right causal, windows and sinks); CUDA only."""
    if device == "cpu":  # measured with fla-core 0.6.0 under Triton 3.9's interpreter
        raise BackendUnavailable(DECODING_NAME, "cpu", "attn_decoding_one_step asks Triton's driver for the GPU's "
                                 "shared memory, and the interpreter has no driver (RuntimeError: 0 active drivers)",
                                 "Run it on a CUDA GPU.")
    problem = unavailable(device, DECODING_NAME)
    if problem is not None:
        raise problem
    one_step = import_backend(DECODING_NAME, "fla.ops.attn.decoding", problem="fla-core is not installed",
                              fix="pip install fla-core==0.6.0 einops").attn_decoding_one_step
    return Kernel(_decoding(one_step), decoding_spec(device), name=DECODING_NAME)


def _spec(device: str) -> KernelSpec:
    return KernelSpec(dtypes=triton_dtypes(device), causal=("top_left", "bottom_right"), attn_mask=False, gqa=True,
                      head_dims=(16, 32, 64, 128), equal_lengths=True, fully_masked_rows="any",
                      precision="flash", devices=(device,), window=True, sinks=True, backward=True,
                      deterministic_backward=False, backward_excludes=("ds_past_range",), nan_safe_masking=True)


def make_fla_kernel(*, device: str = "cuda", form: str = "dense") -> Kernel:
    """``fla:parallel_attn`` on ``device`` (CUDA compiled; the CPU under the Triton interpreter), in the dense form
    or (``form="varlen"``) with its ``cu_seqlens``."""
    problem = unavailable(device, VARLEN_NAME if form == "varlen" else NAME)
    if problem is not None:
        raise problem
    parallel_attn = _parallel_attn()

    def attention(q, k, v, *, scale, causal, attn_mask=None, window=None, sinks=None):
        q, k, v, scale, causal, _, _ = validated_call(NAME, device, q, k, v, scale=scale, causal=causal,
                                                      attn_mask=attn_mask)
        left = -1 if window is None else window[0]
        out = parallel_attn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=scale,
                            window_size=None if left < 0 else left + 1, sink_bias=sinks)
        return out.transpose(1, 2)

    spec = _spec(device)
    if form == "varlen":
        spec = spec.replace(form="varlen", backward=False, backward_excludes=())
        return Kernel(_varlen(parallel_attn), spec, name=VARLEN_NAME)
    return Kernel(attention, spec, name=NAME)
