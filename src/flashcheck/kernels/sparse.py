"""``torch:sparse``: attention over sparse index sets (:mod:`flashcheck.contract.key_sets`) in float32 torch, the
reference of the convention.

``kernel(q, k, v, *, scale, causal, attn_mask=None, indices)``: each query attends the keys its row of ``indices``
lists that the causal alignment and the mask also show. It gathers the listed keys (B, H, Nq, topk, D), as DeepSeek
V3.2's sparse attention does, masks -1 and indices past the keys, and with ``duplicates="once"`` (the default) keeps
the first of each repeated key, so that a key counts once; with the option ``duplicates="twice"`` it attends every
entry, so a key counts as often as listed. Logits, max, sum and normaliser in fp32, rounded once to
the input's dtype. Its planted bugs (:data:`flashcheck.kernels.planted.SPARSE`) are the misreads of the lists
users reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..contract.key_sets import DUPLICATES, KeySets
from ..contract.spec import Kernel, KernelSpec
from ..errors import BackendUnavailable, InvalidArgument
from .sdpa import NO_CUDA_FIX, NO_CUDA_REASON

__all__ = ["CHUNK_ELEMENTS", "RowWeights", "first_of_each", "make_sparse_kernel", "row_weights", "valid_entries"]

_NEG_INF = -math.inf


def valid_entries(idx: torch.Tensor, n_k: int, mutant: str | None) -> torch.Tensor:
    """Which entries of the lists name a key: not -1, not past the keys (each as the planted bug reads it)."""
    if mutant == "padding_reads_key0":
        return idx < n_k
    if mutant == "past_end_clamped":
        return idx >= 0
    valid = (idx >= 0) & (idx < n_k)
    if mutant == "stops_at_padding":  # the list read up to its first -1
        valid = valid & ((idx == -1).cumsum(-1) == 0)
    return valid


def first_of_each(idx: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``valid`` less every repeat of a key earlier in the same list (a stable sort puts each key's first entry
    first among its equals)."""
    keyed = torch.where(valid, idx, -1)  # invalid entries repeat nothing
    ordered, order = keyed.sort(dim=-1, stable=True)
    repeat = torch.zeros_like(valid)
    repeat[..., 1:] = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    return valid & ~torch.zeros_like(valid).scatter_(-1, order, repeat)


def _visible(causal: str, attn_mask, shape, n_k: int, device) -> torch.Tensor:
    """(B or 1, Hq or 1, Nq, Nk) bool of what the causal alignment and the mask show."""
    n_q = shape[2]
    i = torch.arange(n_q, device=device).view(-1, 1)
    j = torch.arange(n_k, device=device).view(1, -1)
    if causal == "bottom_right":
        vis = j <= i + (n_k - n_q)
    elif causal == "top_left":
        vis = j <= i
    else:
        vis = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    vis = vis.view(1, 1, n_q, n_k)
    return vis if attn_mask is None else vis & attn_mask.to(device)


CHUNK_ELEMENTS = 1 << 26  # gathered elements a chunk of queries may hold (256 MB of fp32)


def _attend(q, k, v, indices, *, scale, causal, attn_mask, mutant, once):
    """out (B, Hq, Nq, Dv) in q's dtype and lse (B, Hq, Nq) fp32, a chunk of queries at a time."""
    B, Hq, n_q, _ = q.shape
    n_k, group = k.shape[2], Hq // k.shape[1]
    idx = indices.to(q.device).long()
    idx = idx.repeat_interleave(group, 1) if idx.shape[1] > 1 else idx.expand(B, Hq, -1, -1)
    shown = torch.broadcast_to(_visible(causal, attn_mask, q.shape, n_k, q.device), (B, Hq, n_q, n_k))
    kk, vv = (t.float().repeat_interleave(group, 1).reshape(B * Hq * n_k, -1) for t in (k, v))
    width = idx.shape[-1] * (k.shape[-1] + v.shape[-1])
    step = max(1, CHUNK_ELEMENTS // max(1, B * Hq * width))
    parts = [_attend_rows(q[:, :, r:r + step].float(), kk, vv, idx[:, :, r:r + step], shown[:, :, r:r + step],
                          scale=scale, n_k=n_k, mutant=mutant, once=once) for r in range(0, n_q, step)]
    out = torch.cat([o for o, _ in parts], 2) if parts else q.new_zeros(B, Hq, 0, v.shape[-1]).float()
    lse = torch.cat([s for _, s in parts], 2) if parts else q.new_zeros(B, Hq, 0).float()
    return out.to(q.dtype), lse


def _attend_rows(q, kk, vv, idx, shown, *, scale, n_k, mutant, once):
    """One chunk of query rows: q (B, Hq, R, D) fp32, the keys and values flattened (B * Hq * Nk, D)."""
    B, Hq = q.shape[:2]
    valid = valid_entries(idx, n_k, mutant)
    if once and mutant != "counts_duplicates":
        valid = first_of_each(idx, valid)
    safe = idx.clamp(0, max(n_k - 1, 0))
    if mutant != "ignores_causal":
        valid = valid & shown.gather(-1, safe)
    rows = torch.arange(B * Hq, device=q.device).view(B, Hq, 1, 1) * n_k + safe  # (B, Hq, R, topk)
    w = row_weights(torch.einsum("bhqd,bhqtd->bhqt", q, kk[rows]) * scale, valid)
    return w.normalised(torch.einsum("bhqt,bhqtd->bhqd", w.p, vv[rows]))


@dataclass(frozen=True)
class RowWeights:
    """Each row's unnormalised weights over its gathered entries, ``p = exp(s - m)`` (0 where an entry is not
    valid), the row's max ``m`` (0 on a row with no valid entry) and its sum ``total``, all fp32."""

    p: torch.Tensor
    m: torch.Tensor
    total: torch.Tensor

    def normalised(self, pv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """out = ``pv`` (the weights times V) / total and lse = m + log(total): out 0 and lse -inf on an empty row."""
        return pv / torch.where(self.total > 0, self.total, 1.0)[..., None], self.m + torch.log(self.total)


def row_weights(s: torch.Tensor, valid: torch.Tensor) -> RowWeights:
    """The :class:`RowWeights` of the logits ``s`` (..., topk) fp32 over their ``valid`` entries."""
    s = s.masked_fill(~valid, _NEG_INF)
    m = s.amax(-1)
    m = torch.where(m == _NEG_INF, 0.0, m)  # a row with no visible key: p = 0, out = 0, lse = -inf
    p = torch.exp(s - m[..., None])
    return RowWeights(p, m, p.sum(-1))


def make_sparse_kernel(*, device: str, mutant: str | None = None, duplicates: str = "once") -> Kernel:
    """``torch:sparse``, counting a repeated key ``duplicates`` ("once" or "twice": every entry gathered), with its
    planted bug ``mutant`` (a name the registry checked)."""
    if device == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailable("torch:sparse", "cuda", NO_CUDA_REASON, NO_CUDA_FIX)
    if duplicates not in DUPLICATES:
        raise InvalidArgument("duplicates", duplicates, "unknown convention", f"Use one of {list(DUPLICATES)}.")
    if duplicates == "twice" and mutant == "counts_duplicates":
        raise InvalidArgument("kernel", "torch:sparse[duplicates=twice]~counts_duplicates", "counting a repeated "
                              "key twice is that convention's rule, no bug", "Plant it in torch:sparse alone.")
    spec = KernelSpec(key_sets=KeySets(duplicates=duplicates, past_end="masked", padding="anywhere"),
                      causal=("none", "top_left", "bottom_right"), attn_mask=True, gqa=True,
                      fully_masked_rows="zero", precision="upcast", devices=(device,), max_head_dim=256,
                      backward=True, deterministic_backward=True)

    def sparse(q, k, v, *, scale, causal="none", attn_mask=None, indices):
        return _attend(q, k, v, indices, scale=scale, causal=causal, attn_mask=attn_mask, mutant=mutant,
                       once=duplicates == "once")

    name = "torch:sparse" + ("" if duplicates == "once" else f"[duplicates={duplicates}]")
    return Kernel(sparse, spec, name=f"{name}~{mutant}" if mutant else name)
