"""SGLang's Triton MLA decode (``sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`` with
``has_mla=True``) as a flashcheck kernel of the paged MLA form, ``sglang:mla-decode``: a real third-party kernel.

SGLang's conventions, mapped onto flashcheck's:
- one query a request, q (R, Hq, 576); the cache a pool of token slots (num_slots, 1, 576), each request's slots
  listed in ``kv_indices`` between ``kv_indptr`` offsets; V the view of the pool's first 512 columns. A paged
  cache of flashcheck's is that pool (pages laid end to end), and a sequence's slots are its block table's pages'
  rows in order. Each of a sequence's Nq queries (multi-token prediction) is a request of its own over the prefix
  its bottom-right causal row sees (every key without causal): SGLang's speculative decoding path does the same.
- split-KV inside the kernel: ``num_kv_splits`` per request, up to ``max_kv_splits`` (8, SGLang's default); each
  split's state goes to fp32 workspaces (``attn_logits``, ``attn_lse``), merged by its stage 2. It returns no
  lse: the row's is the log-sum-exp of the splits' (natural log), the workspace set to -inf first, as SGLang's
  callers do, so that a split that saw no key drops out.
- ``sm_scale`` the model's scale; ``k_scale`` and ``v_scale`` 1 (no fp8 cache).
- slot 0 of SGLang's pool is its padding slot, which its allocator never hands out: the pool here is one zero row,
  then the cache.
- with one query head on the K/V head (Hq = 1) SGLang takes its ungrouped stage-1 kernel, which rounds each q.k
  product to the input dtype before its fp32 sum (found on an H100: reports/mla-2026-12-06); MLA's 16 to 128
  heads take the grouped one, whose tl.dot accumulates in fp32.
- a request has at least one key (a decode step attends its own token): a sequence of no keys, or a query whose
  bottom-right row sees none, is :class:`~flashcheck.Unsupported` (skipped), as SGLang never builds one.

``pip install sglang`` (the wheel and its import-time dependencies, about 42 MB; no CUDA kernels of its own are
loaded on this path). It compiles two Triton kernels on first use. CUDA only: the Triton interpreter of triton 3.6
fails inside its ``tl.range``.
"""

from __future__ import annotations

import importlib.util

import torch

from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, Unsupported
from .adapters import import_backend
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["NAME", "DESCRIPTION", "SPLIT_COUNTS", "make_sglang_mla_kernel", "unavailable"]

NAME = "sglang:mla-decode"
DESCRIPTION = ("SGLang's Triton MLA decode (decode_attention_fwd, has_mla=True): one query a request over a pool of "
               "token slots, split-KV inside the kernel")
MAX_KV_SPLITS = 8  # SGLang's default --triton-attention-num-kv-splits
SPLIT_COUNTS = (1, 2, 3, 8)
PAGE_SIZES = (1, 16, 64)
_FIX = "pip install sglang (its Triton MLA decode needs no CUDA kernel of its own)"


def unavailable(device: str, name: str = NAME) -> BackendUnavailable | None:
    """Why the kernel cannot run on ``device``, without importing sglang; None if it can."""
    if device != "cuda":
        return BackendUnavailable(name, device, "SGLang's Triton MLA decode runs on CUDA only (triton 3.6's "
                                  "interpreter fails inside its tl.range)", "Run it with --device cuda.")
    if not torch.cuda.is_available():
        return BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if importlib.util.find_spec("sglang") is None:
        return BackendUnavailable(name, device, "sglang is not installed", _FIX)
    return None


def _requests(block_table, cache_seqlens, n_q: int, page: int, causal: str):
    """(kv_indptr int32 (R + 1,), kv_indices int64): request (b, i) = query i of sequence b, over the slots of the
    keys its row sees, in order."""
    lengths, slots = [], []
    for b, n in enumerate(cache_seqlens.tolist()):
        j = torch.arange(n, device=block_table.device)
        rows = block_table[b].long()[j // page] * page + j % page + 1  # slot 0: SGLang's padding slot
        for i in range(n_q):
            seen = max(0, n - n_q + 1 + i) if causal == "bottom_right" else n
            if seen == 0:  # a decode request attends at least its own token: SGLang never builds one without keys
                raise Unsupported(f"a request with no key (sequence {b} of {n} keys, query {i} of {n_q})")
            lengths.append(seen)
            slots.append(rows[:seen])
    indptr = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=block_table.device)
    indptr[1:] = torch.tensor(lengths, device=block_table.device).cumsum(0)
    return indptr, torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int64, device=block_table.device)


def make_sglang_mla_kernel(*, device: str = "cuda") -> Kernel:
    """SGLang's MLA decode on ``device`` (CUDA), judged at each split count of :data:`SPLIT_COUNTS`."""
    problem = unavailable(device)
    if problem is not None:
        raise problem
    spec = KernelSpec(mla=True, form="paged", dtypes=("fp16", "bf16"), causal=("none", "bottom_right"),
                      fully_masked_rows="zero", precision="flash", devices=(device,), nan_safe_masking=True,
                      page_sizes=PAGE_SIZES, num_splits=SPLIT_COUNTS)
    rank = spec.mla.kv_lora_rank

    def attention(q, kv_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
        decode = import_backend(NAME, "sglang.kernels.ops.attention.decode_attention", problem="sglang is not "
                                "installed", fix=_FIX).decode_attention_fwd
        batch, n_q, heads, d = q.shape
        pool = torch.cat([kv_cache.new_zeros(1, 1, d), kv_cache.reshape(-1, 1, d)])  # slot 0: padding
        indptr, indices = _requests(block_table, cache_seqlens, n_q, kv_cache.shape[1], causal)
        requests = batch * n_q
        out = torch.empty(requests, heads, rank, dtype=q.dtype, device=q.device)
        logits = torch.empty(requests, heads, MAX_KV_SPLITS, rank, dtype=torch.float32, device=q.device)
        lse = torch.full((requests, heads, MAX_KV_SPLITS), -torch.inf, dtype=torch.float32, device=q.device)
        if requests and heads:
            splits = torch.full((requests,), num_splits, dtype=torch.int32, device=q.device)
            decode(q.reshape(requests, heads, d), pool, pool[..., :rank], out, indptr, indices, logits, lse, splits,
                   MAX_KV_SPLITS, scale, 1.0, 1.0, logit_cap=0.0, has_mla=True, page_size=1)
        row_lse = torch.logsumexp(lse, -1).view(batch, n_q, heads).transpose(1, 2)
        return out.view(batch, n_q, heads, rank), row_lse

    attention.__name__ = attention.__qualname__ = "sglang_mla_decode"
    return Kernel(attention, spec, name=NAME)
