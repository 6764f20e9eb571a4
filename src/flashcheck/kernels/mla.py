"""``torch:mla`` and ``torch:mla-paged``: multi-head latent attention's absorbed decode in float32 torch, the
references of the MLA convention (:mod:`flashcheck.contract.mla`) on the dense and the paged form.

Each takes one cached row per token: the logits are two fp32 dots summed, q's latent part against the row's
latent and q's rope part against the row's rope, times the scale it is given; the output is the softmax against
the row's latent, which serves as V. Max-subtracted, summed and normalised in fp32, rounded once to the input's
dtype. Its planted bugs (:data:`flashcheck.kernels.planted.MLA`) are the misreads of the row a kernel can make.
"""

from __future__ import annotations

import math

import torch

from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["attend", "make_mla_kernel"]

_NEG_INF = -math.inf


def _visible(causal: str, n_q: int, n_k: int, device) -> torch.Tensor:
    """(Nq, Nk) bool of the keys each query sees (bottom-right: query i sees keys j <= i + Nk - Nq)."""
    i = torch.arange(n_q, device=device).view(-1, 1)
    j = torch.arange(n_k, device=device).view(1, -1)
    if causal == "bottom_right":
        return j <= i + (n_k - n_q)
    if causal == "top_left":
        return j <= i
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device)


def _values(kv: torch.Tensor, rank: int, mutant: str | None) -> torch.Tensor:
    """The columns of the row read as V: its latent, or a planted misread of it."""
    if mutant == "values_from_rope_end":
        return kv[..., kv.shape[-1] - rank:]
    if mutant == "split_off_by_one":
        return kv[..., 1:rank + 1]
    return kv[..., :rank]


def attend(q, kv, *, rank: int, scale: float, causal: str, mutant: str | None):
    """q (..., Hq, Nq, D) against kv (..., 1, Nk, D): out (..., Hq, Nq, rank) and lse (..., Hq, Nq), fp32."""
    heads, n_q = q.shape[-3], q.shape[-2]
    # Every query head's rows against the one cached row set: (Hq Nq) rows of one matmul, so that the cache is
    # never broadcast to Hq copies (128 of them in DeepSeek V3).
    q, kv = q.float().flatten(-3, -2).unsqueeze(-3), kv.float()
    s = q[..., :rank] @ kv[..., :rank].transpose(-1, -2)
    if mutant != "drops_rope":
        s = s + q[..., rank:] @ kv[..., rank:].transpose(-1, -2)
    s = s * (q.shape[-1] ** -0.5 if mutant == "scale_of_row" else scale)
    s = s.unflatten(-2, (heads, n_q)).squeeze(-4)
    s = s.masked_fill(~_visible(causal, n_q, s.shape[-1], s.device), _NEG_INF)
    m = s.amax(-1) if s.shape[-1] else s.new_full(s.shape[:-1], _NEG_INF)
    m = torch.where(m == _NEG_INF, 0.0, m)  # a row with no visible key: p = 0, out = 0, lse = -inf
    p = torch.exp(s - m[..., None])
    total = p.sum(-1)
    out = (p.flatten(-3, -2).unsqueeze(-3) @ _values(kv, rank, mutant)).unflatten(-2, (heads, n_q)).squeeze(-4)
    return out / torch.where(total > 0, total, 1.0)[..., None], m + torch.log(total)


def _dense(rank: int, mutant: str | None):
    def attention(q, kv, *, scale, causal="none", attn_mask=None):
        out, lse = attend(q, kv, rank=rank, scale=scale, causal=causal, mutant=mutant)
        return out.to(q.dtype), lse

    return attention


def _paged(rank: int, mutant: str | None):
    def attention(q, kv_cache, *, block_table, cache_seqlens, scale, causal="none"):
        page = kv_cache.shape[1]
        out = q.new_empty(q.shape[0], q.shape[1], q.shape[2], rank)
        lse = torch.empty(q.shape[0], q.shape[2], q.shape[1], device=q.device)
        for b, n in enumerate(cache_seqlens.tolist()):
            j = torch.arange(n, device=q.device)
            rows = kv_cache[block_table[b].long()[j // page], j % page]  # (n, 1, D)
            o, lse[b] = attend(q[b].transpose(0, 1), rows.transpose(0, 1), rank=rank, scale=scale, causal=causal,
                                mutant=mutant)
            out[b] = o.transpose(0, 1).to(q.dtype)
        return out, lse

    return attention


# FlashMLA's page size first, then one key a page and a small page.
PAGE_SIZES = (1, 16, 64)


def make_mla_kernel(name: str, *, device: str, mutant: str | None = None) -> Kernel:
    """``torch:mla`` (dense) or ``torch:mla-paged`` over DeepSeek V3's row (512 + 64), with its planted bug
    ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable(name, "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    paged = name.endswith("-paged")
    # Only the paged form never reads what no sequence owns (the dense one multiplies a hidden key's V by 0), and
    # only it runs sequence by sequence (a batched matmul's sums depend on the batch: measured on the CPU).
    spec = KernelSpec(mla=True, form="paged" if paged else "dense", causal=("none", "bottom_right"),
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=paged,
                      nan_safe_masking=paged, page_sizes=PAGE_SIZES if paged else None)
    rank = spec.mla.kv_lora_rank
    fn = (_paged if paged else _dense)(rank, mutant)
    fn.__name__ = fn.__qualname__ = "mla_paged" if paged else "mla"
    return Kernel(fn, spec, name=f"{name}~{mutant}" if mutant else name)
