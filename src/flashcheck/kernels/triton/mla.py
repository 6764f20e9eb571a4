"""``flashcheck:triton-mla``: multi-head latent attention's absorbed decode over a paged cache, split-KV, in Triton.

FlashMLA's kvcache call (:mod:`flashcheck.contract.mla`): ``kernel(q, kv_cache, *, block_table, cache_seqlens, scale,
causal, num_splits)``, q (B, Nq, Hq, 576), kv_cache (num_blocks, page_size, 1, 576), each cached row [latent 512 |
rope 64]. The one KV head serves every query head, so a program's rows are a sequence's (query, head) pairs, Nq x Hq
of them, tile by tile. Split s of a sequence of n keys takes keys n s / S to n (s + 1) / S, each read from its own
page through the block table (``gather_pages``, as ``flashcheck:triton-paged``): the logits are two fp32 dots summed
(q's latent against the row's latent, q's rope against its rope) times the scale passed, in base 2; the latent tile,
read once, serves as V (P rounded to the inputs' dtype before P @ V). Causal is bottom-right per sequence. Each split
writes its partial state (o_s fp32, lse_s natural log; an empty split (0, -inf)) to a workspace the kernel keeps
across calls, as serving engines do, and ``flashcheck:triton-split-kv``'s Triton merge rounds once to the inputs'
dtype. V's tile is the whole latent (512 columns, wider than K's tiles): Triton 3.6's narrow-V miscompile on Hopper
(a V tile of 32 columns or fewer, narrower than Q/K's) cannot arise.

Its planted bugs are switches of the kernels: ``torch:mla``'s four misreads of the row
(:data:`flashcheck.kernels.planted.MLA`) and ``merges_empty_splits`` (an empty split writes nothing, so the merge
takes in the workspace's stale state of an earlier call).
"""

from __future__ import annotations

import math

import torch

from ...contract.spec import Kernel, KernelSpec
from ...errors import InvalidArgument
from ..mla import PAGE_SIZES
from .online import BLOCK_M, BLOCK_N, LN2, finish, gather_pages, online_update, pow2, start_state
from .paged import RUNTIME_SIZES, check_table
from .runtime import import_triton, triton_dtypes
from .split_kv import check_splits, merge_states

__all__ = ["NAME", "SPLIT_COUNTS", "make_mla_triton_kernel", "mla_spec"]

NAME = "flashcheck:triton-mla"

triton, tl = import_triton()


@triton.jit
def _attend_latent(q_lat, q_rope, KV, table_row, qpos, row_ok, lo, hi, n_q, n_k, page_size, skb, sks, scale_log2,
                   CAUSAL: tl.constexpr, DROPS_ROPE: tl.constexpr, V_SHIFT: tl.constexpr, RANK, ROPE,
                   BL: tl.constexpr, BR: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The online softmax (m, l, acc) of the rows (query ``qpos``, a head each) over keys ``lo`` to ``hi`` of a
    sequence of ``n_k`` keys: logits latent . latent + rope . rope, V the latent tile (or, planted, ``V_SHIFT``
    columns on)."""
    lat, rope = tl.arange(0, BL), tl.arange(0, BR)
    m_i, l_i, acc = start_state(BLOCK_M, BL)
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k_lat = gather_pages(KV, table_row, cols, hi, page_size, skb, sks, 0, lat, RANK, False)
        s = tl.dot(q_lat, tl.trans(k_lat))
        if not DROPS_ROPE:
            k_rope = gather_pages(KV, table_row, cols, hi, page_size, skb, sks, RANK, rope, ROPE, False)
            s = s + tl.dot(q_rope, tl.trans(k_rope))
        if V_SHIFT:
            v = gather_pages(KV, table_row, cols, hi, page_size, skb, sks, V_SHIFT, lat, RANK, False)
        else:
            v = k_lat
        visible = (cols[None, :] < hi) & row_ok[:, None]
        if CAUSAL:
            visible = visible & (cols[None, :] <= qpos[:, None] + (n_k - n_q))
        m_i, l_i, acc = online_update(s * scale_log2, v, visible, m_i, l_i, acc)
    return m_i, l_i, acc


@triton.jit(do_not_specialize=RUNTIME_SIZES)
def _mla_partials(Q, KV, O_S, LSE_S, table, seqlens, scale_log2, n_q, heads, batch, splits, page_size, sqb, sqm,
                  sqh, skb, sks, stb, CAUSAL: tl.constexpr, DROPS_ROPE: tl.constexpr, V_SHIFT: tl.constexpr,
                  STALE: tl.constexpr, RANK, ROPE, BL: tl.constexpr, BR: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    tile, seq, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n_k = tl.load(seqlens + seq)
    lo, hi = n_k * split // splits, n_k * (split + 1) // splits
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_q * heads
    qpos, head = rows // heads, rows % heads
    lat, rope = tl.arange(0, BL), tl.arange(0, BR)
    q_row = Q + seq.to(tl.int64) * sqb + qpos[:, None] * sqm + head[:, None] * sqh
    q_lat = tl.load(q_row + lat[None, :], mask=row_ok[:, None] & (lat[None, :] < RANK), other=0.0)
    q_rope = tl.load(q_row + RANK + rope[None, :], mask=row_ok[:, None] & (rope[None, :] < ROPE), other=0.0)
    m_i, l_i, acc = _attend_latent(q_lat, q_rope, KV, table + seq * stb, qpos, row_ok, lo, hi, n_q, n_k, page_size,
                                   skb, sks, scale_log2, CAUSAL, DROPS_ROPE, V_SHIFT, RANK, ROPE, BL, BR, BLOCK_M,
                                   BLOCK_N)
    out, lse2 = finish(m_i, l_i, acc)
    keep = row_ok
    if STALE:  # a planted bug: a split that received no keys writes nothing
        keep = keep & (lo + 0 * rows < hi)
    state = ((split * batch + seq) * heads + head).to(tl.int64) * n_q + qpos
    tl.store(O_S + state[:, None] * RANK + lat[None, :], out, mask=keep[:, None] & (lat[None, :] < RANK))
    tl.store(LSE_S + state, lse2 * LN2, mask=keep)


def _check(q, kv_cache, block_table, cache_seqlens, cache) -> None:
    """Refuse what the kernel cannot read, naming the argument."""
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        if t.dim() != 4 or t.stride(-1) != 1:
            raise InvalidArgument(name, tuple(t.shape), "expected a 4-d tensor with a contiguous last dim",
                                  f"Pass q (B, Nq, Hq, {cache.head_dim}) and kv_cache (num_blocks, page_size, 1, "
                                  f"{cache.head_dim}), .contiguous().")
    if kv_cache.shape[2] != 1 or q.shape[3] != cache.head_dim or kv_cache.shape[3] != cache.head_dim:
        raise InvalidArgument("kv_cache", tuple(kv_cache.shape), f"does not fit q {tuple(q.shape)}: MLA caches one "
                              f"head of rows of {cache.head_dim} ({cache.kv_lora_rank} latent + {cache.rope_dim} "
                              "rope)", f"Pass kv_cache (num_blocks, page_size, 1, {cache.head_dim}) and q of the "
                              "same row width.")
    check_table(q, block_table, cache_seqlens)


class _Workspace:
    """The partial states' fp32 memory, kept across calls and grown when a call needs more (never cleared)."""

    def __init__(self):
        self.buffer = None

    def states(self, splits: int, rows: int, width: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """(o_s, lse_s): views of ``splits * rows`` states of ``width`` columns and their lse."""
        need = splits * rows * (width + 1)
        if self.buffer is None or self.buffer.numel() < need or self.buffer.device != torch.device(device):
            self.buffer = torch.empty(need, dtype=torch.float32, device=device)
        o_s = self.buffer[:splits * rows * width]
        return o_s, self.buffer[splits * rows * width:need]


# The Triton interpreter (the CPU) pays per operation, not per element: there one tile holds a sequence's rows, up to
# this many; a GPU holds BLOCK_M of them (a (BLOCK_M, 512) fp32 accumulator) per tile. A row's sums are its own either
# way, and every sequence of a call gets the same tiles.
INTERPRETER_ROWS = 512


def _rows_per_tile(rows: int, device) -> int:
    return BLOCK_M if torch.device(device).type == "cuda" else min(INTERPRETER_ROWS, pow2(rows))


# The split counts every case is judged at: one split, a few (one uneven), and more splits than a short sequence has
# keys (empty splits). torch:split-kv's 32 as well would cost the interpreter twice the time for no new kind of split.
SPLIT_COUNTS = (1, 2, 3, 16)


def mla_spec(device: str) -> KernelSpec:
    """The spec of ``flashcheck:triton-mla``: DeepSeek V3's row (512 + 64) over pages of 1, 16 or 64, judged at
    every split count of :data:`SPLIT_COUNTS`. Each sequence's rows are its own programs' (batch invariant) and
    every read is masked at its cache length (NaN-safe)."""
    return KernelSpec(mla=True, form="paged", dtypes=triton_dtypes(device), causal=("none", "bottom_right"),
                      fully_masked_rows="zero", precision="flash", devices=(device,), batch_invariant=True,
                      nan_safe_masking=True, page_sizes=PAGE_SIZES, num_splits=SPLIT_COUNTS)


def make_mla_triton_kernel(*, device: str, mutant: str | None = None) -> Kernel:
    """The kernel on ``device``, with its planted bug ``mutant`` (a name the registry checked)."""
    spec = mla_spec(device)
    cache, workspace = spec.mla, _Workspace()
    shift = {"values_from_rope_end": cache.rope_dim, "split_off_by_one": 1}.get(mutant, 0)

    def attention(q, kv_cache, *, block_table, cache_seqlens, scale, causal="none", num_splits=1):
        check_splits(num_splits)
        _check(q, kv_cache, block_table, cache_seqlens, cache)
        batch, n_q, heads, d = q.shape
        rank = cache.kv_lora_rank
        out = torch.empty(batch, n_q, heads, rank, dtype=q.dtype, device=q.device)
        lse = torch.empty(batch, heads, n_q, dtype=torch.float32, device=q.device)
        if not (batch and n_q and heads):
            return out, lse
        o_s, lse_s = workspace.states(num_splits, batch * heads * n_q, rank, q.device)
        scale = d ** -0.5 if mutant == "scale_of_row" else scale
        rows = _rows_per_tile(n_q * heads, q.device)
        _mla_partials[(triton.cdiv(n_q * heads, rows), batch, num_splits)](
            q, kv_cache, o_s, lse_s, block_table, cache_seqlens, scale / math.log(2), n_q, heads, batch, num_splits,
            kv_cache.shape[1], *q.stride()[:3], *kv_cache.stride()[:2], block_table.stride(0),
            CAUSAL=causal == "bottom_right", DROPS_ROPE=mutant == "drops_rope", V_SHIFT=shift,
            STALE=mutant == "merges_empty_splits", RANK=rank, ROPE=cache.rope_dim, BL=pow2(rank),
            BR=pow2(cache.rope_dim), BLOCK_M=rows, BLOCK_N=BLOCK_N, num_warps=8)
        merge_states[(triton.cdiv(heads * n_q, rows), batch)](o_s, lse_s, out, lse, n_q, heads, batch, num_splits,
                                                             *out.stride()[:3], DV=rank, BDV=pow2(rank), BLOCK_M=rows)
        return out, lse

    attention.__name__ = attention.__qualname__ = "triton_mla"
    return Kernel(attention, spec, name=NAME + (f"~{mutant}" if mutant else ""))
