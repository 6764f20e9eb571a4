"""The planted bugs of ``flashcheck:triton``: each a :class:`Mutant`, a few exact text edits of the kernel's
source (``forward.py``: :data:`MUTANTS`; ``backward.py``: :data:`BACKWARD_MUTANTS`) with the area of the
algorithm it breaks and the inputs that expose it. The planted bugs of the attention variants (soft-cap,
ALiBi, attn_bias, window, chunk, sinks) are in :mod:`.planted_variants`. How a mutant is built and loaded:
:mod:`.mutants`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...contract.formats import DTYPES

__all__ = ["AREAS", "BACKWARD_MUTANTS", "MUTANTS", "Mutant", "SOURCES", "backward_mutant"]

# What part of the algorithm a defect lives in.
AREAS = ("rescale", "max", "masking", "causal", "fully_masked_rows", "precision", "scale", "bounds", "layout",
         "gqa", "lse", "delta", "race", "offsets", "softcap", "alibi_slopes", "attn_bias", "window", "chunk", "sinks")

# The kernel sources a mutant's edits apply to, by its target.
SOURCES = {"forward": Path(__file__).parent / "forward.py", "backward": Path(__file__).parent / "backward.py"}


@dataclass(frozen=True)
class Mutant:
    """One planted defect: ``edits`` are ``(old, new)`` texts, each ``old`` found exactly once."""

    name: str
    area: str
    description: str
    edits: tuple[tuple[str, str], ...]
    exposed_by: str
    # The input dtypes in which the edit is a defect; in the others it changes nothing (rounding fp32
    # scores to the fp32 input dtype is a no-op), so a self-test must not count it as missed there.
    dtypes: tuple[str, ...] = DTYPES
    # Which source the edits apply to: "forward" (forward.py) or "backward" (backward.py).
    target: str = "forward"
    # Where the defect can show: a race needs programs that run at once, which the interpreter's
    # one-program-at-a-time loop never does.
    devices: tuple[str, ...] = ("cpu", "cuda")
    # Variant features the exposing cases need beside the area's own (a bias put before the cap needs a cap).
    features: tuple[str, ...] = ()

    @property
    def file(self) -> Path:
        return SOURCES[self.target]


MUTANTS: tuple[Mutant, ...] = (
    # -- online-softmax rescaling ----------------------------------------------------------------------
    Mutant(
        "acc_rescale_forgotten", "rescale",
        "The accumulator is not multiplied by alpha when the running max grows, so earlier key tiles keep "
        "weights relative to a stale max.",
        (("        acc = acc * alpha[:, None]\n", ""),),
        "Two or more key tiles whose row max grows from tile to tile (random scores over Nk > block_n).",
    ),
    Mutant(
        "sum_rescale_forgotten", "rescale",
        "The running sum l is not multiplied by alpha when the running max grows, so the normaliser is too "
        "large.",
        (("l_i = l_i * alpha + tl.sum(p, axis=1)", "l_i = l_i + tl.sum(p, axis=1)"),),
        "Two or more key tiles whose row max grows from tile to tile (random scores over Nk > block_n).",
    ),
    Mutant(
        "max_not_carried", "max",
        "m_new is the current tile's max only; the algebra still cancels, until alpha = exp2(m_old - m_new) "
        "overflows or a fully hidden tile resets m to -inf and wipes the earlier tiles.",
        (("m_new = tl.maximum(m_i, tl.max(s, axis=1))", "m_new = tl.max(s, axis=1)"),),
        "A row whose max falls by > 128 (base 2) from one key tile to the next: huge logits in the first "
        "key tile only.",
    ),
    Mutant(
        "exp_instead_of_exp2", "scale",
        "P uses exp on base-2 scores (alpha still uses exp2), so the weights get the wrong temperature and "
        "disagree with the rescale.",
        (("p = tl.math.exp2(s - m_sub[:, None])", "p = tl.math.exp(s - m_sub[:, None])"),),
        "Any input with unequal scores (random Q, K, V).",
    ),
    # -- tails and bounds ------------------------------------------------------------------------------
    Mutant(
        "tail_keys_unmasked", "bounds",
        "col_ok is dropped from `visible`, so the zero-padded keys past Nk in the last key tile get score 0 "
        "and weight in the normaliser.",
        (("visible = row_ok[:, None] & col_ok[None, :]", "visible = row_ok[:, None]"),),
        "Nk not a multiple of block_n, no causal mask (e.g. Nk = 40, block_n = 16).",
    ),
    Mutant(
        "tail_key_tile_skipped", "bounds",
        "The key loop bound rounds hi down to a multiple of BLOCK_N, so the keys of a partial last tile are "
        "never read.",
        (("for start_n in range(0, hi, BLOCK_N):", "for start_n in range(0, hi // BLOCK_N * BLOCK_N, BLOCK_N):"),),
        "Nk not a multiple of block_n (e.g. Nk = 40, block_n = 16).",
    ),
    Mutant(
        "tail_query_tile_dropped", "bounds",
        "The grid launches Nq // block_m query tiles, so the rows of a partial last tile are never written "
        "(uninitialised memory comes back).",
        (("grid = (triton.cdiv(Nq, block_m), B * Hq)", "grid = (Nq // block_m, B * Hq)"),),
        "Nq not a multiple of block_m (e.g. Nq = 40, block_m = 16).",
    ),
    Mutant(
        "v_load_out_of_bounds", "bounds",
        "The row mask is dropped from the V load, so rows past Nk (and hidden keys) are read; harmless on "
        "zeroed memory, NaN * 0 = NaN when that memory holds NaN.",
        (("mask=v_ok[:, None] & dv_ok[None, :],", "mask=dv_ok[None, :],"),),
        "Nk not a multiple of block_n with V inside NaN guard bands (to_device(guard_bands=True)).",
    ),
    # -- causality --------------------------------------------------------------------------------------
    Mutant(
        "causal_diagonal_excluded", "causal",
        "The causal test uses < instead of <=, so a query never sees its own (diagonal) key and the first "
        "row sees nothing.",
        (("(cols[None, :] <= offs_m[:, None] + causal_offset)", "(cols[None, :] < offs_m[:, None] + causal_offset)"),),
        "Any causal input (top_left, Nq = Nk).",
    ),
    Mutant(
        "bottom_right_wrong_sign", "causal",
        "The bottom-right causal offset is Nq - Nk instead of Nk - Nq, which only matters when the lengths "
        "differ.",
        (('"bottom_right": Nk - Nq}', '"bottom_right": Nq - Nk}'),),
        "causal='bottom_right' with Nq != Nk (e.g. Nq = 24, Nk = 40).",
    ),
    Mutant(
        "causal_skip_off_by_one", "causal",
        "The causal tile-skip bound forgets the +1, so when the last key a query tile may see starts a key "
        "tile that tile is skipped.",
        (("tl.maximum(last_row + causal_offset + 1, 0)", "tl.maximum(last_row + causal_offset, 0)"),),
        "causal='top_left' with Nq = Nk = 2 * block + 1 (the last row's diagonal key starts a key tile).",
    ),
    # -- rows with no visible key ----------------------------------------------------------------------
    Mutant(
        "fully_masked_rows_nan", "fully_masked_rows",
        "The m_sub guard is removed, so a row with no visible key computes exp2(-inf - -inf) = NaN.",
        (('m_sub = tl.where(m_new == float("-inf"), 0.0, m_new)', "m_sub = m_new"),),
        "A boolean mask with an all-False row (or bottom_right with Nq > Nk).",
    ),
    Mutant(
        "fully_masked_rows_zero_div", "fully_masked_rows",
        "The l_safe guard is removed, so a row with no visible key divides 0 / 0 = NaN.",
        (("l_safe = tl.where(l_i == 0.0, 1.0, l_i)", "l_safe = l_i"),),
        "A boolean mask with an all-False row (or bottom_right with Nq > Nk).",
    ),
    # -- precision ---------------------------------------------------------------------------------------
    Mutant(
        "acc_rounded_to_fp16", "precision",
        "The accumulator is rounded to fp16 after every tile; the unnormalised sum of P @ V overflows "
        "fp16's 65504 long before the output does.",
        (("acc = tl.dot(p_lo, v, acc, input_precision=INPUT_PRECISION)",
          "acc = tl.dot(p_lo, v, acc, input_precision=INPUT_PRECISION).to(tl.float16).to(tl.float32)"),),
        "Flat attention over many keys with large V (|v| ~ 1000, Nk = 128): the unnormalised sum passes 65504.",
    ),
    Mutant(
        "scores_rounded_to_input_dtype", "precision",
        "Q @ K^T is rounded to the input dtype and multiplied by the scale in it (the scale and the product "
        "rounded too) before softmax, so large logits lose their low bits.",
        # The scale cast as well: a half tensor times the fp32 scalar is half in the interpreter, fp32 compiled.
        # tl.cast, as the interpreter passes the scalar as a Python float (rounded to fp32 first, as the host's).
        (("s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale",
          "s = (tl.dot(q, k, input_precision=INPUT_PRECISION).to(Q.dtype.element_ty)"
          " * tl.cast(qk_scale, Q.dtype.element_ty)).to(tl.float32)"),),
        "fp16 near-tied large logits: q, k ~ 8 +- 0.1, so q.k ~ 1024 where fp16's spacing is 1, with "
        "diffuse attention (scale 0.25).",
        dtypes=("fp16", "bf16"),
    ),
    Mutant(
        "p_rounded_to_bf16", "precision",
        "P is rounded through bf16 (8 significant bits) before P @ V instead of to the fp16 input dtype.",
        (("p_lo = p.to(V.dtype.element_ty)", "p_lo = p.to(tl.bfloat16).to(V.dtype.element_ty)"),),
        "fp16, diffuse attention (random Q, K, V): errors about 8x fp16's P rounding; fp32 under tf32, "
        "only where every weight rounds the same way (coherent_p_rounding): about 1.6x the budget.",
        dtypes=("fp16", "fp32"),
    ),
    # -- the softmax scale -------------------------------------------------------------------------------
    Mutant(
        "scale_ignored", "scale",
        "The host passes 1/sqrt(D) * log2(e) instead of the given scale.",
        (("causal_offset, scale * _LOG2E,", "causal_offset, _LOG2E / math.sqrt(shapes.head_dim),"),),
        "A scale other than 1/sqrt(D) (e.g. 0.7).",
    ),
    Mutant(
        "log2e_forgotten", "scale",
        "The host passes the scale without the log2(e) factor while the kernel uses exp2.",
        (("causal_offset, scale * _LOG2E,", "causal_offset, scale,"),),
        "Any input with unequal scores (random Q, K, V).",
    ),
    # -- memory layout ------------------------------------------------------------------------------------
    Mutant(
        "q_row_stride_packed", "layout",
        "Query rows are addressed with head_dim instead of stride_qm, which only holds for contiguous Q.",
        (("q_base + offs_m[:, None] * stride_qm", "q_base + offs_m[:, None] * head_dim"),),
        "A non-contiguous Q: strided (padded rows) or transposed (B, N, H, D) storage.",
    ),
    Mutant(
        "kv_head_stride_packed", "layout",
        "K/V heads are addressed as n_k * head_dim apart instead of by their head strides, which only holds "
        "for contiguous K and V.",
        (("off_hkv.to(tl.int64) * stride_kh", "off_hkv.to(tl.int64) * n_k * head_dim"),
         ("off_hkv.to(tl.int64) * stride_vh", "off_hkv.to(tl.int64) * n_k * head_dim_v")),
        "K/V with expanded (stride-0) or transposed heads and Hkv > 1 (here expanded, in NaN guard bands).",
    ),
    Mutant(
        "gqa_heads_interleaved", "gqa",
        "Query head h reads key/value head h % Hkv instead of h // group.",
        (("off_hkv = off_h // group", "off_hkv = off_h % (n_heads_q // group)"),),
        "GQA with distinct key heads, e.g. Hq = 4, Hkv = 2.",
    ),
    # -- the boolean mask ---------------------------------------------------------------------------------
    Mutant(
        "mask_row_stride_packed", "masking",
        "Mask rows are addressed with n_k instead of stride_mm, which breaks masks broadcast over queries "
        "(stride 0).",
        (("m_base + offs_m[:, None] * stride_mm", "m_base + offs_m[:, None] * n_k"),),
        "A key-padding mask of shape (1, 1, 1, Nk), broadcast over the query rows.",
    ),
    Mutant(
        "additive_mask_bias", "masking",
        "Hidden keys get an additive -inf bias instead of tl.where, so a NaN or inf score of a hidden key "
        "becomes NaN instead of -inf.",
        (('s = tl.where(visible, s, float("-inf"))', 's = s + tl.where(visible, 0.0, float("-inf"))'),),
        "A mask hiding keys whose K holds NaN (poisoned padding).",
    ),
    # -- the log-sum-exp -----------------------------------------------------------------------------------
    Mutant(
        "lse_log2_units", "lse",
        "lse is returned in base-2 units (the * ln 2 is missing).",
        (("(m_i + tl.math.log2(l_safe)) * 0.6931471805599453", "(m_i + tl.math.log2(l_safe))"),),
        "Any input, comparing lse (random Q, K, V).",
    ),
    Mutant(
        "lse_missing_max", "lse",
        "lse forgets the running max: log(l) instead of m + log(l).",
        (("(m_i + tl.math.log2(l_safe)) * 0.6931471805599453", "tl.math.log2(l_safe) * 0.6931471805599453"),),
        "Any input whose row max is not 0, comparing lse (random Q, K, V).",
    ),
)

def backward_mutant(name: str, area: str, description: str, edits, exposed_by: str, **more) -> Mutant:
    """A planted bug of backward.py."""
    return Mutant(name, area, description, tuple(edits), exposed_by, target="backward", **more)


# The lines where each backward kernel turns the saved lse into base 2 (dK/dV kernel, then dQ kernel).
_LSE2_DKDV = '\n            lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)'
_LSE2_DQ = '\n    lse2 = tl.where(lse == float("-inf"), 0.0, lse * 1.4426950408889634)'
_DS_DK = 'dk = tl.dot(tl.trans(ds), q.to(tl.float32), dk, input_precision="ieee")'
_DS_DQ = 'dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")'
_P_DV = "dv = tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, dv, input_precision=INPUT_PRECISION)"
_P_MASKED = 'p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)'

BACKWARD_MUTANTS: tuple[Mutant, ...] = (
    # -- D = rowsum(dO * O) --------------------------------------------------------------------------
    backward_mutant(
        "d_missing", "delta",
        "D is never computed (zeros), so dS = P dP instead of P (dP - D).",
        [("delta = (do.float() * out.float()).sum(-1)", "delta = torch.zeros_like(lse)")],
        "Any input whose dO is not orthogonal to O (random dO).",
    ),
    backward_mutant(
        "d_of_kv_head", "delta",
        "The dQ kernel reads D at the K/V head's index instead of the query head's, so the other query "
        "heads of a group use another head's D.",
        [("\n    d_base = _head(Delta, off_b, off_h, stride_lb, stride_lh)",
          "\n    d_base = _head(Delta, off_b, off_hkv, stride_lb, stride_lh)")],
        "GQA with several query heads per K/V head (Hq = 4, Hkv = 2), random dO.",
    ),
    # -- the saved lse ---------------------------------------------------------------------------------
    backward_mutant(
        "lse_log2_units_backward", "lse",
        "The backward takes the saved (natural-log) lse as base 2, so every recomputed P is off by a "
        "factor exp2(lse (1 - log2 e)).",
        [(_LSE2_DKDV, _LSE2_DKDV.replace("lse * 1.4426950408889634", "lse")),
         (_LSE2_DQ, _LSE2_DQ.replace("lse * 1.4426950408889634", "lse"))],
        "Any row whose lse is not 0 (random Q, K, V).",
    ),
    # -- masking in the recomputation ------------------------------------------------------------------
    backward_mutant(
        "p_not_masked", "masking",
        "P is recomputed without the mask (dS still masked), so hidden keys get weight in dV.",
        [(_P_MASKED, "p = tl.math.exp2(s - lse2[:, None])")],
        "A boolean mask or causality hiding keys from some rows.",
    ),
    backward_mutant(
        "causal_top_left_backward", "causal",
        "The backward aligns a bottom-right causal mask top-left (offset 0), unlike the forward.",
        [('"bottom_right": Nk - Nq}[causal]', '"bottom_right": 0}[causal]')],
        "causal='bottom_right' with Nq != Nk (e.g. Nq = 24, Nk = 40).",
    ),
    backward_mutant(
        "causal_diagonal_excluded_backward", "causal",
        "The backward's causal test uses < instead of <=, so the diagonal key gets no gradient.",
        [("(cols[None, :] <= offs_m[:, None] + causal_offset)", "(cols[None, :] < offs_m[:, None] + causal_offset)")],
        "Any causal input.",
    ),
    # -- the softmax scale -----------------------------------------------------------------------------
    backward_mutant(
        "scale_missing_in_dq", "scale",
        "dQ is never multiplied by the softmax scale.",
        [("    dq = dq * scale\n", "")],
        "Any scale other than 1 with random dO.",
    ),
    backward_mutant(
        "scale_missing_in_dk", "scale",
        "dK is never multiplied by the softmax scale.",
        [("    dk = dk * scale\n", "")],
        "Any scale other than 1 with random dO.",
    ),
    # -- precision ---------------------------------------------------------------------------------------
    backward_mutant(
        "ds_rounded_to_bf16", "precision",
        "dS is rounded through bf16 (8 significant bits) before its two matmuls.",
        [(_DS_DK, _DS_DK.replace("tl.trans(ds)", "tl.trans(ds.to(tl.bfloat16).to(tl.float32))")),
         (_DS_DQ, _DS_DQ.replace("(ds,", "(ds.to(tl.bfloat16).to(tl.float32),"))],
        "fp16 inputs with random Q, K, V and dO: dQ and dK off by bf16's rounding of dS.",
        # fp32 under the tf32 contract: the logits' tf32 error already moves dS by as much (missed in
        # 60 H200 cases); the strict contract (the CPU) catches it.
        dtypes=("fp16",),
    ),
    backward_mutant(
        "p_rounded_to_bf16_in_dv", "precision",
        "P is rounded through bf16 before dV = P^T dO instead of to the fp16 input dtype.",
        [(_P_DV, _P_DV.replace("p.to(DO.dtype.element_ty)", "p.to(tl.bfloat16).to(DO.dtype.element_ty)"))],
        "fp16, diffuse attention with random dO: dV off by about 8x fp16's rounding of P.",
        dtypes=("fp16",),
    ),
    backward_mutant(
        "dv_accumulated_in_fp16", "precision",
        "The dV accumulator is rounded to fp16 after every query tile.",
        [(_P_DV, _P_DV + ".to(tl.float16).to(tl.float32)")],
        "fp32 inputs (fp16's rounding), bf16 with huge dO (fp16 overflows), fp16 over many query tiles.",
    ),
    # -- GQA -----------------------------------------------------------------------------------------------
    backward_mutant(
        "gqa_not_summed", "gqa",
        "dK and dV take the first query head of each group only, not the sum over the group.",
        [("for g in range(0, group):", "for g in range(0, 1):")],
        "GQA with several query heads per K/V head (Hq = 4, Hkv = 2).",
    ),
    # -- tails ----------------------------------------------------------------------------------------------
    backward_mutant(
        "tail_query_tile_skipped", "bounds",
        "The dK/dV kernel's query loop rounds n_q down to a multiple of BLOCK_M, so the rows of a partial "
        "last query tile never reach dK and dV.",
        [("for start_m in range(0, n_q, BLOCK_M):", "for start_m in range(0, n_q // BLOCK_M * BLOCK_M, BLOCK_M):")],
        "Nq not a multiple of block_m (e.g. Nq = 40, block_m = 32).",
    ),
    backward_mutant(
        "tail_key_tile_skipped_in_dq", "bounds",
        "The dQ kernel's key loop rounds n_k down to a multiple of BLOCK_N, so the keys of a partial last "
        "key tile never reach dQ.",
        [("for start_n in range(0, n_k, BLOCK_N):", "for start_n in range(0, n_k // BLOCK_N * BLOCK_N, BLOCK_N):")],
        "Nk not a multiple of block_n (e.g. Nk = 40, block_n = 32).",
    ),
    # -- rows with no visible key -------------------------------------------------------------------------
    backward_mutant(
        "fully_masked_rows_nan_backward", "fully_masked_rows",
        "Hidden scores are set to -inf and the lse guard is gone, so a row with no visible key (lse = -inf) "
        "recomputes P = exp2(-inf - -inf) = NaN, and NaN reaches dV.",
        [(_LSE2_DKDV, "\n            lse2 = lse * 1.4426950408889634"),
         (_LSE2_DQ, "\n    lse2 = lse * 1.4426950408889634"),
         (_P_MASKED, 'p = tl.math.exp2(tl.where(visible, s, float("-inf")) - lse2[:, None])')],
        "A boolean mask with an all-False row (or bottom_right with Nq > Nk), dO not zero on that row.",
    ),
    # -- a race ---------------------------------------------------------------------------------------------
    backward_mutant(
        "dq_race_between_key_blocks", "race",
        "dQ is split over two programs per query tile (even and odd key tiles), each adding its share to "
        "dQ in memory with a plain load and store: when they overlap, one share is lost.",
        [("dq = torch.empty_like(q, memory_format=torch.contiguous_format)",
          "dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)"),
         ("_launch(triton, dq_kernel, lambda bm, bn: (triton.cdiv(Nq, bm), B * Hq),",
          "_launch(triton, dq_kernel, lambda bm, bn: (triton.cdiv(Nq, bm), B * Hq, 2),"),
         ("for start_n in range(0, n_k, BLOCK_N):", "for start_n in range(tl.program_id(2) * BLOCK_N, n_k, 2 * BLOCK_N):"),
         ("    _store_tile(_head(DQ, off_b, off_h, stride_dqb, stride_dqh), offs_m, offs_d, stride_dqm, stride_dqd,\n"
          "                row_ok, d_ok, dq.to(DQ.dtype.element_ty))",
          "    dq_base = _head(DQ, off_b, off_h, stride_dqb, stride_dqh)\n"
          "    dq += _tile(dq_base, offs_m, offs_d, stride_dqm, stride_dqd, row_ok, d_ok)\n"
          "    _store_tile(dq_base, offs_m, offs_d, stride_dqm, stride_dqd, row_ok, d_ok, dq)"),
         ("    return dq, dk, dv", "    return dq.to(q.dtype), dk, dv")],
        "Two or more key tiles (Nk > block_n) on a GPU; the interpreter runs one program at a time.",
        devices=("cuda",),
    ),
)

