"""A provisional float64 comparison for attention kernels, shared by the interpreter and GPU tests.

The reference is plain torch float64 from the exact inputs (every product of two fp16/bf16/fp32
numbers is exact in float64). The tolerance is a first-order per-element budget in the spirit of
DESIGN.md's error model, with a safety factor; flashcheck's real error model replaces it later.
For output element (i, k), with a_ij the exact softmax weights and w_ik = sum_j a_ij |v_jk|:

    tol_ik = C * [ w_ik * (u_p + u_v + 2 gamma_K + 2 u32 + expm1(2 eta_i))   P cast, tf32 V, sums
                   + sp_p * sum_j |v_jk| / l_i ]                              subnormal P
             + u_o |o_ik| + sp_o                                             output rounding

- u_p: rounding of the unnormalised P (input dtype; tf32 for fp32 as tf32, else exact fp32),
  u_v: rounding of V inside the matmul (tf32 only), u_o: the output dtype's unit roundoff.
- gamma_K = K u32 / (1 - K u32) over the Nk terms of P @ V and of l plus one rescale per key tile.
- eta_i bounds the error of every visible logit of row i: fp32 accumulation over D (gamma_D), tf32
  rounding of Q and K, and the scale/exp2 arithmetic (a few u32 of |s_ij|). A logit error eta moves
  each weight by at most a factor e^(+-2 eta), hence expm1(2 eta) * w.
- sp_p, sp_o: the subnormal spacing of P's and of the output's dtype (absolute rounding near zero;
  matters for fp16, whose subnormals start at 6e-5).
- C = 4: a safety factor on the first-order terms.

lse is compared with |lse - lse_ref| <= C * (eta_i + gamma_K + 4 u32 (max_j |s_ij| + |lse_i| + 1)),
i.e. a few fp32 ulps of the largest logit plus the logit error. Rows with no visible key must give
out exactly 0 and lse = -inf.
"""

from __future__ import annotations

import math

import torch

from flashcheck.floats import FORMATS, TF32, format_of
from flashcheck.masks import visible as visible_keys

__all__ = ["C", "Reference", "reference", "tolerances", "assert_close_to_reference"]

C = 4.0
_U32 = FORMATS["fp32"].unit_roundoff
# tf32 conversion may truncate rather than round (DESIGN.md): take 2^-10, not 2^-11.
_U_TF32 = 2.0 ** -(TF32.significand_bits - 1)


def _gamma(n: int) -> float:
    return n * _U32 / (1.0 - n * _U32)


class Reference:
    """Float64 attention and the quantities the tolerance needs, all on the inputs' device."""

    def __init__(self, q, k, v, *, scale, causal, attn_mask):
        B, Hq, Nq, D = q.shape
        Hkv, Nk = k.shape[1], k.shape[2]
        group = Hq // Hkv
        qd = q.to(torch.float64)
        # GQA: query head h reads key/value head h // group.
        kd = k.to(torch.float64).repeat_interleave(group, dim=1)
        vd = v.to(torch.float64).repeat_interleave(group, dim=1)
        self.visible = visible_keys(causal, attn_mask, (B, Hq, Nq, Nk), device=q.device)
        self.empty = ~self.visible.any(dim=-1)  # rows with no visible key

        s = scale * (qd @ kd.transpose(-1, -2))
        s = torch.where(self.visible, s, float("-inf"))
        row_max = s.amax(dim=-1, keepdim=True)
        row_max = torch.where(torch.isinf(row_max), torch.zeros_like(row_max), row_max)
        e = torch.exp(s - row_max)  # exp(-inf) = 0 for hidden keys
        l = e.sum(dim=-1, keepdim=True)
        l_safe = torch.where(l == 0, torch.ones_like(l), l)
        a = e / l_safe
        self.out = a @ vd
        self.weight_scale = a @ vd.abs()  # w_ik
        self.lse = torch.where(self.empty, float("-inf"), (row_max + torch.log(l_safe)).squeeze(-1))
        self.l = l_safe.squeeze(-1)  # relative to the row max
        self.abs_v_sum = self.visible.to(torch.float64) @ vd.abs()  # sum_j visible |v_jk|
        self.abs_logit_max = torch.where(self.visible, s.abs(), 0.0).amax(dim=-1)
        # sum_d |q_id||k_jd| bounds the accumulation error of each logit, scaled by |scale| below.
        qk_abs = qd.abs() @ kd.abs().transpose(-1, -2)
        self.qk_abs_max = torch.where(self.visible, qk_abs, 0.0).amax(dim=-1) * abs(scale)
        self.n_k, self.head_dim = Nk, D


def reference(q, k, v, *, scale, causal, attn_mask=None) -> Reference:
    return Reference(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)


def tolerances(ref: Reference, dtype: torch.dtype, *, tf32: bool = False, block_n: int = 16):
    """Per-element tolerance of out (B, H, Nq, Dv) and per-row tolerance of lse (B, H, Nq)."""
    fmt = format_of(dtype)
    is_fp32 = fmt.name == "fp32"
    u_in = fmt.unit_roundoff
    u_mm = _U_TF32 if (is_fp32 and tf32) else 0.0  # operands of both matmuls rounded to tf32
    u_p = u_mm if is_fp32 else u_in  # P is rounded to the input dtype (a no-op for fp32)
    u_v = u_mm
    gamma_k = _gamma(ref.n_k + math.ceil(ref.n_k / block_n) + 2)
    eta = (
        ref.qk_abs_max * (_gamma(ref.head_dim) + 2 * u_mm)
        + 8 * _U32 * ref.abs_logit_max
        + 4 * _U32  # exp2's own error (a couple of ulps, relative)
    )
    eta = eta.unsqueeze(-1)
    p_spacing = fmt.subnormal_spacing if not is_fp32 else FORMATS["fp32"].subnormal_spacing
    out_abs = ref.out.abs()
    tol_out = (
        C * (ref.weight_scale * (u_p + u_v + 2 * gamma_k + 2 * _U32 + torch.expm1(2 * eta))
             + p_spacing * ref.abs_v_sum / ref.l.unsqueeze(-1))
        + fmt.unit_roundoff * out_abs
        + fmt.subnormal_spacing
    )
    lse_finite = torch.where(ref.empty, 0.0, ref.lse)
    tol_lse = C * (eta.squeeze(-1) + gamma_k + 4 * _U32 * (ref.abs_logit_max + lse_finite.abs() + 1))
    return tol_out, tol_lse


def _where(index, shape) -> tuple:
    return tuple(int(i) for i in torch.unravel_index(torch.as_tensor(index), shape))


def assert_close_to_reference(out, lse, q, k, v, *, scale, causal, attn_mask=None, tf32=False,
                              block_n=16):
    """Assert that (out, lse) of an attention kernel match float64 attention within the budget.

    ``tf32=True`` when fp32 inputs ran with tf32 matmuls (Triton on the GPU by default);
    ``block_n`` (the key tile size) only sizes the rescale count in gamma_K: 16 is the worst case.
    Returns the worst err/tol ratio of out, for tests that want to print or bound it further.
    """
    B, Hq, Nq, _ = q.shape
    Dv = v.shape[-1]
    assert out.shape == (B, Hq, Nq, Dv), f"out shape {tuple(out.shape)} != {(B, Hq, Nq, Dv)}"
    assert out.dtype == q.dtype, f"out dtype {out.dtype} != q's {q.dtype}"
    assert lse.shape == (B, Hq, Nq), f"lse shape {tuple(lse.shape)} != {(B, Hq, Nq)}"
    assert lse.dtype == torch.float32, f"lse dtype {lse.dtype} != torch.float32"

    ref = reference(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask)
    out64 = out.to(torch.float64)
    lse64 = lse.to(torch.float64)

    empty = ref.empty
    if bool(empty.any()):
        bad = empty & ~(out64 == 0).all(dim=-1)
        assert not bool(bad.any()), (
            f"{int(bad.sum())} fully masked rows are not 0, first at (b, h, i) = "
            f"{_where(bad.flatten().nonzero()[0, 0], bad.shape)}: "
            f"{out64[bad][0][:8].tolist()}"
        )
        bad = empty & ~(lse64 == float("-inf"))
        assert not bool(bad.any()), (
            f"{int(bad.sum())} fully masked rows have lse != -inf: {lse64[bad][:8].tolist()}"
        )

    tol_out, tol_lse = tolerances(ref, q.dtype, tf32=tf32, block_n=block_n)
    err = (out64 - ref.out).abs()
    ratio = torch.where(torch.isfinite(out64), err / tol_out, torch.full_like(err, float("inf")))
    worst = int(ratio.flatten().argmax())
    where = _where(worst, ratio.shape)
    assert float(ratio.flatten()[worst]) <= 1.0, (
        f"out differs from float64 attention at (b, h, i, k) = {where}: out {out64[where].item()!r}, "
        f"ref {ref.out[where].item()!r}, |err| {err[where].item():.3e} > tol {tol_out[where].item():.3e} "
        f"(err/tol = {ratio[where].item():.3g}; w = {ref.weight_scale[where].item():.3e})"
    )

    lse_err = torch.where(empty, 0.0, (lse64 - ref.lse).abs())
    lse_err = torch.where(torch.isnan(lse64), float("inf"), lse_err)
    lse_ratio = lse_err / tol_lse
    worst_l = int(lse_ratio.flatten().argmax()) if lse_ratio.numel() else 0
    where_l = _where(worst_l, lse_ratio.shape)
    assert float(lse_ratio.flatten()[worst_l]) <= 1.0, (
        f"lse differs from float64 at (b, h, i) = {where_l}: lse {lse64[where_l].item()!r}, "
        f"ref {ref.lse[where_l].item()!r}, |err| {lse_err[where_l].item():.3e} > "
        f"tol {tol_lse[where_l].item():.3e}"
    )
    return float(ratio.max())
