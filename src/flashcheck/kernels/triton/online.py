"""What flashcheck's Triton kernels of the serving forms share: the online-softmax step over one key tile
(scores in fp32 and base 2, P rounded to the values' dtype before P @ V), its end (out, base-2 lse), the
gather of a key tile from a paged cache and tile sizes."""

from __future__ import annotations

from .runtime import import_triton

__all__ = ["BLOCK_M", "BLOCK_N", "LN2", "finish", "gather_pages", "online_step", "online_update", "pow2",
           "start_state"]

# Tile sizes: 16 is tl.dot's least; the interpreter on the CPU runs the same code.
BLOCK_M, BLOCK_N = 32, 32

triton, tl = import_triton()
# A global a compiled @triton.jit reads must be a constexpr (the interpreter reads any).
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def start_state(BLOCK_M: tl.constexpr, BDV: tl.constexpr):
    """The online softmax before any key: running max -inf, sum 0, accumulator 0."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    return m_i, tl.zeros([BLOCK_M], tl.float32), tl.zeros([BLOCK_M, BDV], tl.float32)


@triton.jit
def online_step(q, kt, v, visible, m_i, l_i, acc, scale_log2):
    """One key tile: ``kt`` (BD, BLOCK_N), ``v`` (BLOCK_N, BDV), ``visible`` (BLOCK_M, BLOCK_N)."""
    return online_update(tl.dot(q, kt) * scale_log2, v, visible, m_i, l_i, acc)


@triton.jit
def online_update(s2, v, visible, m_i, l_i, acc):
    """One key tile of scores already scaled to base 2, ``s2`` (BLOCK_M, BLOCK_N), with its values ``v``."""
    s = tl.where(visible, s2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, l_i, acc


@triton.jit
def q_tile_and_bases(Q, K, V, heads_q, GROUP, n_q, n_k, sqb, sqh, sqm, sqd, skb, skh, svb, svh, D,
                     CAUSAL: tl.constexpr, BD: tl.constexpr, BLOCK_M: tl.constexpr):
    """The program's query tile of a (B, H, N, D) kernel with one program per (query tile, batch entry * query head):
    the tile (rows past n_q and dims past D are 0), its rows, the bases of its K/V head's keys and values, the causal
    offset (bottom-right: n_k - n_q), its flattened (batch entry, query head) and (batch entry, K/V head)."""
    tile, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // heads_q, bh % heads_q
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BD)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :] * sqd,
                mask=(rows[:, None] < n_q) & (dims[None, :] < D), other=0.0)
    k_base, v_base = K + b * skb + (h // GROUP) * skh, V + b * svb + (h // GROUP) * svh
    offset = n_k - n_q if CAUSAL == 2 else 0
    return q, rows, k_base, v_base, offset, bh, b * (heads_q // GROUP) + h // GROUP


@triton.jit
def finish(m_i, l_i, acc):
    """(out fp32, lse in base 2): 0 and -inf on a row that saw no key."""
    seen = l_i > 0
    out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
    return out, tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))


@triton.jit
def gather_pages(cache, table_row, cols, n_read, page_size, s_block, s_slot, head_offset, dims, width,
                 OFF_BY_ONE: tl.constexpr):
    """The (BLOCK_N, BW) tile of keys (or values) ``cols`` of one sequence, each read from its own page through
    the block table row, masked past ``n_read``; ``OFF_BY_ONE`` (a planted bug) takes the first key of every
    page after the first from the page before."""
    keep = cols < n_read
    logical = (tl.maximum(cols - 1, 0) if OFF_BY_ONE else cols) // page_size
    page = tl.load(table_row + logical, mask=keep, other=0).to(tl.int64)
    where = page * s_block + (cols % page_size) * s_slot + head_offset
    return tl.load(cache + where[:, None] + dims[None, :], mask=keep[:, None] & (dims[None, :] < width), other=0.0)


def pow2(n: int) -> int:
    return max(16, 1 << (n - 1).bit_length())
