"""Planted bugs of ``flashcheck:triton`` for the numerical mistakes of :mod:`flashcheck.defects`: each an independent
implementation, in the kernel's own source, of a mistake that a defect model commits in the twin, so that the model
can be seen to name it. Forward (``forward.py``) and backward (``backward.py``) edits, in :data:`DEFECT_MUTANTS`.
The self-test leaves them out (its counts are those of :mod:`.planted` and :mod:`.planted_variants`);
``flashcheck:triton~NAME`` loads them as any other (:mod:`.mutants`)."""

from __future__ import annotations

from .planted import Mutant, backward_mutant

__all__ = ["DEFECT_MUTANTS"]

_HALVES = ("fp16", "bf16")  # the input dtypes where rounding to the input dtype loses anything

# The texts of forward.py that several mutants edit.
_SCORES = "        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale\n"
_HIDE = '        s = tl.where(visible, s, float("-inf"))\n'
_ROW_SUM = "l_i = l_i * alpha + tl.sum(p, axis=1)"
_QK_SCALE_ARG = "    qk_scale,  # softmax scale * log2(e): scores live in the base-2 domain so exp2 can be used\n"
_M_INIT = '    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)\n'
_HOST_SCALE = "causal_offset, scale * _LOG2E,"
_KEY_LOOP = "    for start_n in range(0, hi, BLOCK_N):\n"
_V_OK = "        v_ok = col_ok & (tl.max(visible.to(tl.int32), axis=0) > 0)\n"
_LAUNCH = "    launch = {}\n"

# The texts of backward.py.
_DS_DK = '            dk = tl.dot(tl.trans(ds), q.to(tl.float32), dk, input_precision="ieee")  # dS stays fp32\n'
_DS_DQ = '        dq = tl.dot(ds, k.to(tl.float32), dq, input_precision="ieee")  # dS stays fp32\n'
_SCALE_DK = "    dk = dk * scale\n"
_SCALE_DQ = "    dq = dq * scale\n"
_P_DV = "dv = tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, dv, input_precision=INPUT_PRECISION)"
_P_MASKED = "p = tl.where(visible, tl.math.exp2(s - lse2[:, None]), 0.0)"
_DS_LO = "ds_lo = (ds * scale).to(Q.dtype.element_ty)  # scale x dS, the matmuls' operand\n"
_GROUP_LOOP = "    for g in range(0, group):\n        off_h = off_hkv * group + g\n"

# Each query head's dK and dV share kept apart (dk_h, dv_h) before the group's sum, which the edit after these adds.
_SHARES_APART = (
    (_GROUP_LOOP, "    for g in range(0, group):\n"
                  "        dk_h = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)  # this query head's share\n"
                  "        dv_h = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)\n"
                  "        off_h = off_hkv * group + g\n"),
    (_P_DV, "dv_h = tl.dot(tl.trans(p.to(DO.dtype.element_ty)), do, dv_h, input_precision=INPUT_PRECISION)"),
    (_DS_DK, _DS_DK.replace("dk = tl.dot(tl.trans(ds), q.to(tl.float32), dk,",
                            "dk_h = tl.dot(tl.trans(ds), q.to(tl.float32), dk_h,")),
)


def _sum_in_input_dtype(factor: str) -> tuple[tuple[str, str], ...]:
    """Q K^T summed in the input dtype one head dim after the other (the order of tl.sum(q[:, :, None] *
    k[None, :, :], axis=1) under the Triton interpreter), then times ``factor`` in fp32.

    Not that tl.sum itself: compiled Triton rewrites it into a tl.dot (whose fp32 zero accumulator for fp16
    operands fails an MLIR assertion), and a GPU reduction has its own order. FP fusion is off, or the compiled
    kernel fuses each product into its partial sum (one fma: the product never rounded)."""
    return (
        (_SCORES, "        s_lo = tl.zeros([BLOCK_M, BLOCK_N], dtype=q.dtype)\n"
                  "        for d in range(0, head_dim):\n"
                  "            # Column d of q and row d of k, exactly (the other terms are 0).\n"
                  "            q_d = tl.sum(tl.where(offs_d[None, :] == d, q, 0.0), axis=1)\n"
                  "            k_d = tl.sum(tl.where(offs_d[:, None] == d, k, 0.0), axis=0)\n"
                  "            s_lo = s_lo + q_d[:, None] * k_d[None, :]\n"
                  f"        s = s_lo.to(tl.float32) * {factor}\n"),
        (_LAUNCH, '    launch = {"enable_fp_fusion": False}  # each product rounded before it is added\n'),
    )


DEFECT_MUTANTS: tuple[Mutant, ...] = (
    # -- Q K^T ---------------------------------------------------------------------------------------------
    Mutant(
        "qk_products_in_input_dtype", "precision",
        "Q K^T is formed as a broadcast product summed over the head dim instead of tl.dot: each q.k product is "
        "rounded to the input dtype, then the products are summed in fp32.",
        ((_SCORES, "        s = tl.sum((q[:, :, None] * k[None, :, :]).to(tl.float32), axis=1) * qk_scale\n"),),
        "fp16 near-tied large logits: q, k ~ 8 +- 0.1 (products near 64, where fp16's spacing is 2^-5), diffuse "
        "attention (scale 0.25).",
        dtypes=_HALVES,
    ),
    Mutant(
        "qk_sum_in_input_dtype", "precision",
        "Q K^T is summed over the head dim in the input dtype, one product after the other: every product and "
        "every partial sum is rounded to it before the scores go to fp32.",
        _sum_in_input_dtype("qk_scale"),
        "fp16 near-tied large logits: q, k ~ 8 +- 0.1, so q.k ~ 1024 where fp16's spacing is 1, with diffuse "
        "attention (scale 0.25).",
        dtypes=_HALVES,
    ),
    Mutant(
        "scores_rounded_then_promoted", "precision",
        "Q K^T is rounded to the input dtype and promoted back to fp32 before the scale multiplies it: the "
        "scores lose their low bits, the logits do not round again.",
        ((_SCORES, "        s = tl.dot(q, k, input_precision=INPUT_PRECISION).to(Q.dtype.element_ty).to(tl.float32)"
                   " * qk_scale\n"),),
        "fp16 near-tied large logits: q, k ~ 8 +- 0.1, so q.k ~ 1024 where fp16's spacing is 1, with diffuse "
        "attention (scale 0.25).",
        dtypes=_HALVES,
    ),
    Mutant(
        "q_prescaled_in_input_dtype", "precision",
        "Q is multiplied by the softmax scale once, before the key loop, and stored back in the input dtype; the "
        "loop then multiplies the scores by log2(e) alone. Each scaled q loses its low bits.",
        ((_QK_SCALE_ARG, "    sm_scale,  # the softmax scale: Q is multiplied by it once, before the key loop\n"),
         (_M_INIT, "    q = (q.to(tl.float32) * sm_scale).to(Q.dtype.element_ty)\n" + _M_INIT),
         (_SCORES, "        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * 1.4426950408889634\n"),
         (_HOST_SCALE, "causal_offset, scale,")),
        "fp16 inputs and a scale that is not a power of two, with peaked or large logits (q, k ~ 8 +- 0.1, "
        "scale 0.3): the rounding of scale x q moves the logits.",
        dtypes=_HALVES,
    ),
    Mutant(
        "q_prescaled_sum_in_input_dtype", "precision",
        "Q is multiplied by the softmax scale in the input dtype before the key loop, and Q K^T is summed over "
        "the head dim in the input dtype, one product after the other, as a decoding kernel that reduces with "
        "tl.sum in half does: the scaled q, every product and every partial sum lose their low bits.",
        ((_QK_SCALE_ARG, "    sm_scale,  # the softmax scale: Q is multiplied by it once, before the key loop\n"),
         (_M_INIT, "    q = (q.to(tl.float32) * sm_scale).to(Q.dtype.element_ty)\n" + _M_INIT),
         *_sum_in_input_dtype("1.4426950408889634"),
         (_HOST_SCALE, "causal_offset, scale,")),
        "fp16 near-tied large logits and a scale that is not a power of two (q, k ~ 8 +- 0.1, scale 0.3).",
        dtypes=_HALVES,
    ),
    # -- the online softmax ---------------------------------------------------------------------------------
    Mutant(
        "row_sum_rounded_to_fp16", "precision",
        "The running sum l is rounded to fp16 after every key tile: 11 significant bits in the normaliser, and "
        "inf past 65,504 (flat rows of more keys).",
        ((_ROW_SUM, f"l_i = ({_ROW_SUM[6:]}).to(tl.float16).to(tl.float32)"),),
        "fp32 inputs under the strict contract (input_precision='ieee'), random Q, K, V over several key tiles "
        "(the flash contract's tf32 allows as much); in any dtype, flat attention over more than 65,504 keys.",
    ),
    # -- masking --------------------------------------------------------------------------------------------
    Mutant(
        "finite_mask_sentinel", "masking",
        "Hidden keys are not hidden: their logits get fp16's lowest value, -65,504 (natural units), added, as "
        "an additive mask of finfo(float16).min does, so every key tile is walked and V read for every key. A "
        "row whose visible logits lie more than 65,504 below a hidden key's gives the hidden keys its weight.",
        ((_HIDE, '        s = tl.where(col_ok[None, :], s, float("-inf"))  # keys past Nk\n'
                 "        s = tl.where(visible, s, s - 65504.0 * 1.4426950408889634)\n"),
         (_KEY_LOOP, "    for start_n in range(0, n_k, BLOCK_N):\n"),
         (_V_OK, "        v_ok = col_ok\n")),
        "A mask hiding keys whose logits are more than 65,504 above the row's visible ones (logits of -40,000 on "
        "the visible keys, +40,000 on the hidden ones: q = 100, k = +-100, D = 16, scale 0.25), or a row the mask "
        "hides entirely.",
    ),
    # -- the backward ---------------------------------------------------------------------------------------
    backward_mutant(
        "scaled_ds_rounded_to_input_dtype", "precision",
        "scale x dS is rounded to the input dtype as the operand of dQ = dS K and dK = dS^T Q (the scale applied "
        "to dS, not to dQ and dK at the end): past 65,504 in fp16 it is inf where dQ and dK are representable.",
        [(_DS_DK, "            " + _DS_LO + "            dk = tl.dot(tl.trans(ds_lo.to(tl.float32)), q.to(tl.float32), "
                  'dk, input_precision="ieee")\n'),
         (_SCALE_DK, ""),
         (_DS_DQ, "        " + _DS_LO +
                  '        dq = tl.dot(ds_lo.to(tl.float32), k.to(tl.float32), dq, input_precision="ieee")\n'),
         (_SCALE_DQ, "")],
        "fp16 with a large scale (16) and scale x dS past 65,504 while dQ and dK cancel (V = +-50, dO = 12.5, "
        "query rows of opposite signs); a tiny scale or tiny P puts scale x dS among fp16's subnormals.",
        dtypes=_HALVES,
    ),
    backward_mutant(
        "p_rounded_for_ds", "precision",
        "The recomputed P is rounded to the input dtype once, as dV's matmul takes it, and dS = P (dP - D) reads "
        "the rounded P: weights below fp16's smallest normal (6.1e-5) keep an absolute error of up to 3e-8.",
        [(_P_MASKED, _P_MASKED + ".to(q.dtype).to(tl.float32)")],
        "fp16, peaked P with weights below 6.1e-5 (logit gaps of 10 to 25: the subnormal_p regime), dO along O.",
        dtypes=_HALVES,
    ),
    backward_mutant(
        "group_shares_rounded", "gqa",
        "With GQA, each query head's dK and dV share is kept apart and added to the group's sum in the input "
        "dtype, as a kernel that writes an expanded (B, Hq, Nk, D) dK and dV and sums the group afterwards: a "
        "share past 65,504 is inf, and two of opposite signs give NaN where the summed dK is small.",
        [*_SHARES_APART,
         (_SCALE_DK, "        dk += (dk_h * scale).to(DK.dtype.element_ty).to(tl.float32)\n"
                     "        dv += dv_h.to(DV.dtype.element_ty).to(tl.float32)\n")],
        "fp16 GQA whose query heads' dK shares pass 65,504 and cancel: Hq = 2 on Hkv = 1, scale 16, V = +-50, "
        "dO = +-6.25 of opposite signs on the two heads (shares of +-120,000, the exact dK 0).",
        dtypes=_HALVES,
    ),
    backward_mutant(
        "group_sum_in_input_dtype", "gqa",
        "With GQA, the group's running sum of dK and dV is kept in the input dtype: rounded after each query "
        "head's share is added, so a share past 65,504 makes it inf, which the next head's share of opposite sign "
        "cannot bring back.",
        [*_SHARES_APART,
         (_SCALE_DK, "        dk = (dk + dk_h * scale).to(DK.dtype.element_ty).to(tl.float32)\n"
                     "        dv = (dv + dv_h).to(DV.dtype.element_ty).to(tl.float32)\n")],
        "fp16 GQA whose query heads' dK shares pass 65,504 and cancel: Hq = 2 on Hkv = 1, scale 16, V = +-50, "
        "dO = +-6.25 of opposite signs on the two heads (shares of +-120,000, the exact dK 0).",
        dtypes=_HALVES,
    ),
    backward_mutant(
        "ds_rounded_to_fp16", "precision",
        "dS is rounded through fp16 before its two matmuls: past 65,504 it is inf, where scale x dS and every "
        "gradient are representable.",
        [(_DS_DK, _DS_DK.replace("tl.trans(ds)", "tl.trans(ds.to(tl.float16).to(tl.float32))")),
         (_DS_DQ, _DS_DQ.replace("(ds,", "(ds.to(tl.float16).to(tl.float32),"))],
        "dS past 65,504 while the gradients cancel: V = +-1000, dO = 12.5, query rows of opposite signs, scale "
        "1/16 (fp16 inputs); fp32 inputs with random Q, K, V and dO (fp16's rounding).",
    ),
)
