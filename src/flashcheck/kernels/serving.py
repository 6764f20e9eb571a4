"""Kernels of the serving forms: the references ``torch:varlen`` and ``torch:paged``, and ``torch:jagged``.

Each runs a PyTorch SDPA backend (``torch:math`` unless ``backend=`` names another) on every sequence in
turn, on the keys its offsets or its block table give it: what a correct varlen or paged kernel computes,
with no tiling across sequences. Their planted bugs (:mod:`flashcheck.kernels.planted`: ``torch:varlen~NAME``,
``torch:paged~NAME``) are the defects that serving kernels have shipped with.
``torch:jagged`` is PyTorch's own varlen path: jagged nested tensors through SDPA.
"""

from __future__ import annotations

import dataclasses

import torch

from ..contract.formats import DTYPES
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, InvalidArgument
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON, SDPA_KERNELS, make_sdpa_kernel
from .split_kv import make_split_kv_kernel

__all__ = ["make_serving_kernel"]


def _sequence_variant(variant: dict, b: int) -> dict:
    slopes = variant.get("alibi_slopes")
    if slopes is not None and slopes.dim() == 2:
        return {**variant, "alibi_slopes": slopes[b:b + 1]}
    return variant


def _one(dense: Kernel, q, k, v, b: int, *, scale, causal, variant) -> torch.Tensor:
    """Sequence ``b``'s output (Nq, Hq, Dv) from its q (Nq, Hq, D) and keys (Nk, Hkv, D); zeros without keys."""
    if k.shape[0] == 0:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    dense_in = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    out = dense(*dense_in, scale=scale, causal=causal, **_sequence_variant(variant, b))
    return out[0].transpose(0, 1)


_MAX_LENGTHS = ("max_seqlen_q", "max_seqlen_k")


def _varlen(dense: Kernel, mutant: str | None):
    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, scale, causal="none", seqused_k=None, **call):
        # the max lengths bound what the offsets give already; every other keyword is the variant's
        variant = {name: value for name, value in call.items() if name not in _MAX_LENGTHS}
        cu_q = cu_seqlens_q.tolist()
        cu_k = (cu_seqlens_q if mutant == "shared_offsets" else cu_seqlens_k).tolist()
        used = None if seqused_k is None or mutant == "ignores_seqused_k" else seqused_k.tolist()
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
        for b in range(len(cu_q) - 1):
            if cu_q[b + 1] == cu_q[b]:
                continue
            stop = (cu_k[b + 1] if used is None else cu_k[b] + used[b]) + (mutant == "reads_past_end")
            keys = slice(cu_k[b], stop)
            # a read past the packed tensor's end goes on into its storage, as a kernel's pointer would
            k_b, v_b = (_rows(t, keys) for t in (k, v))
            out[cu_q[b]:cu_q[b + 1]] = _one(dense, q[cu_q[b]:cu_q[b + 1]], k_b, v_b, b, scale=scale, causal=causal,
                                           variant=variant)
        return out

    return attention


def _rows(t: torch.Tensor, rows: slice) -> torch.Tensor:
    """Rows ``rows`` of a packed tensor, reading on into its storage past its end (poison, in flashcheck's cases)."""
    if rows.stop <= t.shape[0]:
        return t[rows]
    return t.as_strided((rows.stop - rows.start,) + tuple(t.shape[1:]), t.stride(),
                        t.storage_offset() + rows.start * t.stride(0))


def _paged(dense: Kernel, mutant: str | None):
    def attention(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", **variant):
        page = k_cache.shape[1]
        out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3])
        for b, n in enumerate(cache_seqlens.tolist()):
            if mutant == "ignores_cache_len":
                n = -(-n // page) * page
            j = torch.arange(n, device=q.device)
            slot = j % page
            pages = j // page if mutant != "page_off_by_one" else (j - 1).clamp_min(0) // page
            physical = block_table[b].long()[pages]
            out[b] = _one(dense, q[b], k_cache[physical, slot], v_cache[physical, slot], b, scale=scale,
                          causal=causal, variant=variant)
        return out

    return attention


def _jagged(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """The packed batch as jagged nested tensors (B, H, j, D), through SDPA in one call."""
    nested = [torch.nested.nested_tensor_from_jagged(t, offsets.long()).transpose(1, 2)
              for t, offsets in ((q, cu_seqlens_q), (k, cu_seqlens_k), (v, cu_seqlens_k))]
    out = torch.nn.functional.scaled_dot_product_attention(*nested, scale=scale)
    return out.transpose(1, 2).values()


def _jagged_kernel(device: str) -> Kernel:
    # Measured (reports/serving-2026-12-02): where flash cannot run it (any head dim on the CPU; on CUDA a head dim
    # not a multiple of 8), PyTorch's math composite runs in the inputs' dtype, q and k each times sqrt(scale),
    # so fp16 and bf16 scores are rounded to them (up to 15,938 x the budget on an H200) and a negative scale is
    # NaN. The spec keeps those inputs out (fp32 alone on the CPU, head dims multiple of 8 on CUDA, no negative
    # scale), and crashes on batches with an empty sequence; tests/unit/test_jagged_defects.py and
    # tests/gpu/test_serving_gpu.py keep them visible.
    dtypes, dims = (("fp32",), None) if device == "cpu" else (DTYPES, tuple(range(8, 257, 8)))
    spec = KernelSpec(form="varlen", dtypes=dtypes, causal=("none",), gqa=False, dv_equals_d=True, head_dims=dims,
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=False,
                      nan_safe_masking=True, excludes=("empty_sequences", "negative_scale"))
    return Kernel(_jagged, spec, name="torch:jagged")


def make_serving_kernel(name: str, *, device: str, backend: str = "math", mutant: str | None = None) -> Kernel:
    """``torch:varlen``, ``torch:paged`` or ``torch:split-kv`` (with its planted bug ``mutant``, a name the registry
    checked), ``torch:varlen`` and ``torch:paged`` over the SDPA backend ``backend``; or ``torch:jagged``."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if name == "torch:jagged":
        return _jagged_kernel(device)
    form = name.split(":")[1]
    if name == "torch:split-kv":
        return make_split_kv_kernel(device=device, mutant=mutant)
    dense_name = f"torch:{backend}"
    if dense_name not in SDPA_KERNELS:
        raise InvalidArgument("backend", backend, "not a PyTorch SDPA backend",
                              f"Use one of {[n.split(':')[1] for n in SDPA_KERNELS]}.")
    dense = make_sdpa_kernel(dense_name, device=device)
    spec = dataclasses.replace(dense.spec, form=form, attn_mask=False, attn_bias=False, fp32_bias=False,
                               batch_invariant=True, fully_masked_rows="zero", backward=False,
                               seqused_k=form == "varlen")
    fn = (_varlen if form == "varlen" else _paged)(dense, mutant)
    options = f"[backend={backend}]" if backend != "math" else ""
    label = f"{name}~{mutant}{options}" if mutant else f"{name}{options}"
    fn.__name__ = fn.__qualname__ = form
    return Kernel(fn, spec, name=label)
