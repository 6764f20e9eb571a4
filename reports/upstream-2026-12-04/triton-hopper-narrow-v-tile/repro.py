"""Triton on Hopper: P @ V gives wrong outputs (or an illegal memory access) when the V tile is narrower than the
Q/K tile and at most 32 columns wide.

A plain flash-attention forward kernel (online softmax, fp16 inputs, fp32 accumulators), 64 x 64 Q/K tiles:
- control: the V tile as wide as the Q/K tile (32 columns for D = 24, Dv = 16);
- the defect: the V tile 16 columns wide (Dv = 16 padded to tl.dot's minimum), narrower than the Q/K tile.
Both are compared with float64 attention; each call is made twice (the illegal access often shows on the second).

Exit status: 1 reproduced (the narrow tile is wrong or raises while the control is right), 0 not reproduced,
2 cannot run here (no CUDA GPU, no Triton, not a Hopper GPU, or the control itself is wrong).
Needs torch and triton only. Found on an H200 with torch 2.11 and Triton 3.6.
"""

from __future__ import annotations

import sys
import traceback

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the exit status says so below
    triton = None

B, HQ, HKV, NQ, NK, D, DV = 2, 4, 1, 52, 63, 24, 16
BLOCK_M = BLOCK_N = 64
BLOCK_D = 32  # D = 24 padded to a power of two
STAGES = (2, 3, 4)  # software pipelining depths tried (the defect showed with 4 and with Triton's default)
ATOL = 1e-2  # the Triton tutorial's tolerance; the defect's errors are far above it, correct fp16 ones far below
LOG2E = 1.4426950408889634

# The sizes are not specialised (Triton's default specialises an integer argument on == 1 and on divisibility
# by 16), the strides are: the defect shows only in that combination (with every integer specialised, or none,
# the same kernel is right).
SIZES = ("heads_q", "group", "n_q", "n_k", "head_dim", "head_dim_v")

if triton is not None:
    @triton.jit(do_not_specialize=SIZES)
    def _forward(Q, K, V, Out, stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
                 stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
                 heads_q, group, n_q, n_k, head_dim, head_dim_v, qk_scale,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
        pid_m = tl.program_id(0)
        off_b = tl.program_id(1) // heads_q
        off_h = tl.program_id(1) % heads_q
        off_hkv = off_h // group
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        offs_dv = tl.arange(0, BLOCK_DV)
        q_ptr = Q + off_b * stride_qb + off_h * stride_qh
        k_ptr = K + off_b * stride_kb + off_hkv * stride_kh
        v_ptr = V + off_b * stride_vb + off_hkv * stride_vh
        row_ok = offs_m < n_q
        # Padded rows and columns load as 0 (the tensors are contiguous: the last dim has stride 1).
        q = tl.load(q_ptr + offs_m[:, None] * stride_qm + offs_d[None, :],
                    mask=row_ok[:, None] & (offs_d[None, :] < head_dim), other=0.0)
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
        for start in range(0, n_k, BLOCK_N):
            cols = start + offs_n
            col_ok = cols < n_k
            k = tl.load(k_ptr + cols[None, :] * stride_kn + offs_d[:, None],
                        mask=(offs_d[:, None] < head_dim) & col_ok[None, :], other=0.0)
            s = tl.dot(q, k) * qk_scale
            s = tl.where(col_ok[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + cols[:, None] * stride_vn + offs_dv[None, :],
                        mask=col_ok[:, None] & (offs_dv[None, :] < head_dim_v), other=0.0)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # the P @ V that goes wrong
            m_i = m_new
        out = acc / l_i[:, None]
        o_ptr = Out + off_b * stride_ob + off_h * stride_oh
        tl.store(o_ptr + offs_m[:, None] * stride_om + offs_dv[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_dv[None, :] < head_dim_v))


def attention(q, k, v, scale: float, block_dv: int, stages: int) -> torch.Tensor:
    """softmax(q k^T scale) v with ``block_dv`` columns in the V tile, software-pipelined over ``stages``; q
    (B, Hq, Nq, D), k and v (B, Hkv, Nk, .)."""
    b, heads_q, n_q, head_dim = q.shape
    n_k, head_dim_v = v.shape[2], v.shape[3]
    out = torch.empty(b, heads_q, n_q, head_dim_v, dtype=q.dtype, device=q.device)
    grid = (triton.cdiv(n_q, BLOCK_M), b * heads_q)
    _forward[grid](q, k, v, out, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                   heads_q, heads_q // k.shape[1], n_q, n_k, head_dim, head_dim_v, scale * LOG2E,
                   BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D, BLOCK_DV=block_dv, num_warps=4,
                   num_stages=stages)
    return out


def reference(q, k, v, scale: float) -> torch.Tensor:
    """Attention in float64, each K/V head shared by its group of query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))
    return torch.softmax(q.double() @ k.transpose(-1, -2) * scale, dim=-1) @ v


def inputs(device):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*shape, generator=g).half().to(device)
               for shape in ((B, HQ, NQ, D), (B, HKV, NK, D), (B, HKV, NK, DV)))
    return q, k, v, D ** -0.5


def worst_error(block_dv: int, stages: int, device) -> float:
    """The largest |out - exact| over two identical calls (an exception propagates)."""
    q, k, v, scale = inputs(device)
    exact = reference(q, k, v, scale)
    worst = 0.0
    for _ in range(2):
        out = attention(q, k, v, scale, block_dv, stages)
        torch.cuda.synchronize(device) if device.type == "cuda" else None
        worst = max(worst, float((out.double() - exact).abs().max()))
    return worst


def cannot_run() -> str | None:
    if triton is None:
        return "Triton is not installed"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"the defect is Hopper's (sm_90); this GPU is sm_{''.join(map(str, torch.cuda.get_device_capability()))}"
    return None


def main() -> int:
    why = cannot_run()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    print(f"fp16 B={B} Hq={HQ} Hkv={HKV} Nq={NQ} Nk={NK} D={D} Dv={DV}, Q/K tile {BLOCK_M}x{BLOCK_N}x{BLOCK_D}")
    # Every control first: an illegal memory access leaves the process's CUDA context unusable.
    for stages in STAGES:
        control = worst_error(BLOCK_D, stages, device)
        print(f"control, V tile {BLOCK_D} columns, {stages} stages: max |out - exact| = {control:.3g} (tolerance {ATOL})")
        if not control <= ATOL:
            print("cannot run: the control is wrong too, so the kernel here, not the V tile, is at fault", file=sys.stderr)
            return 2
    for stages in STAGES:
        try:
            narrow = worst_error(DV, stages, device)
        except Exception:
            traceback.print_exc()
            print(f"REPRODUCED: the kernel with a {DV}-column V tile and {stages} stages raised (above)")
            return 1
        print(f"V tile {DV} columns, {stages} stages: max |out - exact| = {narrow:.3g} (tolerance {ATOL})")
        if not narrow <= ATOL:
            print(f"REPRODUCED: a {DV}-column V tile under a {BLOCK_D}-column Q/K tile gives wrong outputs "
                  f"({stages} pipeline stages)")
            return 1
    print("not reproduced: every tile within the tolerance")
    return 0


if __name__ == "__main__":
    sys.exit(main())
