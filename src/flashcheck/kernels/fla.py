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
is left out.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .adapters import import_backend, validated_call
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "VARLEN_NAME", "DESCRIPTION", "make_fla_kernel"]

NAME = "fla:parallel_attn"
VARLEN_NAME = "fla:parallel_attn-varlen"
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

    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal, window=None,
                  sinks=None):
        left = -1 if window is None else window[0]
        out = parallel_attn(q[None], k[None], v[None], scale=scale, window_size=None if left < 0 else left + 1,
                            sink_bias=sinks, cu_seqlens=cu_seqlens_k.long())
        return out[0]

    return attention


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

    dtypes = ("fp16", "fp32") if device == "cpu" else ("fp16", "bf16", "fp32")
    spec = KernelSpec(dtypes=dtypes, causal=("top_left", "bottom_right"), attn_mask=False, gqa=True,
                      head_dims=(16, 32, 64, 128), equal_lengths=True, fully_masked_rows="any",
                      precision="flash", devices=(device,), window=True, sinks=True, backward=True,
                      deterministic_backward=False, backward_excludes=("ds_past_range",))
    if form == "varlen":
        spec = spec.replace(form="varlen", backward=False, backward_excludes=())
        return Kernel(_varlen(parallel_attn), spec, name=VARLEN_NAME)
    return Kernel(attention, spec, name=NAME)
