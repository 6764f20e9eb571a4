"""Serving-form kernels that decline some inputs with flashcheck.Unsupported, importable as
tests.robustness._serving_kernels:NAME (a worker process imports them by name, as it does a user's kernel).

Each computes what the reference kernel of its form computes (``torch:varlen``, ``torch:paged``,
``torch:split-kv``), and raises Unsupported for a limit its spec cannot express, as a third-party serving
kernel does: every such case is a skip with the kernel's reason, never a finding.
"""

import torch

import flashcheck
from flashcheck.kernels.registry import resolve_kernel

FEWER_KEYS = "fewer keys than queries"
ONE_SEQUENCE = "a batch of one sequence"
MANY_SPLITS = "4 splits need 4 keys in every sequence"

_VARLEN, _PAGED, _SPLIT_KV = (resolve_kernel(name, device="cpu")
                               for name in ("torch:varlen", "torch:paged", "torch:split-kv"))
# fp32 alone keeps the campaigns short; upcast is the precision of the PyTorch math backend the references run
SERVING = dict(dtypes=("fp32",), causal=("none", "bottom_right"), gqa=True, dv_equals_d=False,
               fully_masked_rows="zero", precision="upcast")


@flashcheck.kernel(**SERVING, form="varlen")
def varlen(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """Declines a batch in which a sequence has fewer keys than queries."""
    if bool((cu_seqlens_k.diff() < cu_seqlens_q.diff()).any()):
        raise flashcheck.Unsupported(FEWER_KEYS)
    return _VARLEN.fn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, scale=scale, causal=causal)


@flashcheck.kernel(**SERVING, form="paged")
def paged(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none"):
    """Declines a batch in which a sequence has fewer cached keys than queries."""
    if bool((cache_seqlens < q.shape[1]).any()):
        raise flashcheck.Unsupported(FEWER_KEYS)
    return _PAGED.fn(q, k_cache, v_cache, block_table=block_table, cache_seqlens=cache_seqlens, scale=scale,
                     causal=causal)


@flashcheck.kernel(**{**SERVING, "precision": "flash"}, form="paged", num_splits=(1, 4))
def split_kv(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
    """Declines 4 splits (its second split count) where a sequence has fewer than 4 keys."""
    if num_splits == 4 and bool((cache_seqlens < 4).any()):
        raise flashcheck.Unsupported(MANY_SPLITS)
    return _SPLIT_KV.fn(q, k_cache, v_cache, block_table=block_table, cache_seqlens=cache_seqlens, scale=scale,
                        causal=causal, num_splits=num_splits)


@flashcheck.kernel(**SERVING, form="varlen", batch_invariant=True)
def varlen_batches_only(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """Declines a batch of one sequence: only the batch property's rerun (the last sequence alone) meets it."""
    if len(cu_seqlens_q) == 2:
        raise flashcheck.Unsupported(ONE_SEQUENCE)
    return _VARLEN.fn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, scale=scale, causal=causal)


@flashcheck.kernel(**SERVING, form="varlen", backward=True)
def varlen_differentiable(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                          causal="none"):
    """A varlen kernel that declares a backward pass (autograd differentiates the reference)."""
    return _VARLEN.fn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, scale=scale, causal=causal)


@flashcheck.kernel(**SERVING, form="varlen")
def varlen_out_of_memory(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
    """Runs out of device memory on a batch of more than 8 keys (raised by hand: the CPU has no CUDA allocator)."""
    if k.shape[0] > 8:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
    return _VARLEN.fn(q, k, v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k, max_seqlen_q=max_seqlen_q,
                      max_seqlen_k=max_seqlen_k, scale=scale, causal=causal)
