"""The planted bugs of ``flashcheck:triton``'s attention variants (soft-cap, ALiBi, attn_bias, window, chunk,
sinks): each a :class:`~.planted.Mutant` of the forward (:data:`VARIANT_MUTANTS`) or the backward
(:data:`VARIANT_BACKWARD_MUTANTS`), kept apart from the planted bugs of plain attention, whose self-test
they leave as it was. :func:`~.mutants.load_mutant` finds them by name."""

from __future__ import annotations

from .planted import Mutant, backward_mutant

__all__ = ["VARIANT_BACKWARD_MUTANTS", "VARIANT_MUTANTS"]

# The texts of forward.py that several mutants edit.
_CAP = "            s = softcap2 * _tanh(s / softcap2)\n"
_CAP_BLOCK = ("        if has_softcap:\n"
              "            # Before the masks: capped after them, a hidden key's -inf would become -c and get weight.\n"
              + _CAP)
_SCORES = "        s = tl.dot(q, k, input_precision=INPUT_PRECISION) * qk_scale\n"
_HIDE = '        s = tl.where(visible, s, float("-inf"))\n'
_WINDOW_LEFT = "(cols[None, :] >= centre - window_left)"
_WINDOW_RIGHT = "(cols[None, :] <= centre + window_right)"
_SLOPE = "slope2 = tl.load(Slopes + off_b * stride_sb + off_h * stride_sh) * 1.4426950408889634"
_ADD_BIAS = "            s = s + b * 1.4426950408889634\n"
_BIAS_HIDES = ("        if HAS_BIAS:\n"
               '            visible = visible & (b != float("-inf"))  # as a mask\'s False: V not read, a row of them '
               "empty\n")

VARIANT_MUTANTS: tuple[Mutant, ...] = (
    # -- soft-capping ------------------------------------------------------------------------------------
    Mutant(
        "softcap_before_scale", "softcap",
        "The cap is applied to q.k before the softmax scale multiplies it, scale * c tanh(q.k / c) instead "
        "of c tanh(scale * q.k / c): the logits are capped at c * scale, and bent where q.k nears c.",
        ((_SCORES + _CAP_BLOCK,
          "        s = tl.dot(q, k, input_precision=INPUT_PRECISION)\n" + _CAP_BLOCK + "        s = s * qk_scale\n"),),
        "softcap with logits near the cap and scale != 1 (c = 2, scale = 0.5, random Q and K of D = 16).",
    ),
    Mutant(
        "softcap_after_masking", "softcap",
        "The cap is applied after the masks set hidden keys to -inf: tanh(-inf) = -1, so every hidden key "
        "(and every tail key past Nk) comes back with logit -c and weight e^-c.",
        ((_CAP_BLOCK, ""), (_HIDE, _HIDE + "        if has_softcap:\n" + _CAP)),
        "softcap with a small cap (c = 1) and keys hidden by a mask, causality or a window (or Nk not a "
        "multiple of block_n).",
    ),
    Mutant(
        "softcap_divides_back", "softcap",
        "tanh(s / c) is divided by c instead of multiplied back: the logits shrink to at most 1 / c, and "
        "the attention is nearly uniform.",
        ((_CAP, "            s = _tanh(s / softcap2) / softcap2\n"),),
        "Any softcap with unequal scores (random Q, K, V, c = 2).",
    ),
    Mutant(
        "softcap_in_base_2", "softcap",
        "The host passes the cap c without the log2(e) factor while the kernel caps base-2 scores: the "
        "logits are capped at c ln 2 instead of c.",
        (("1.0 if softcap is None else softcap * _LOG2E", "1.0 if softcap is None else softcap"),),
        "softcap with logits near or past the cap (c = 2, scale = 0.5, random Q and K of D = 16).",
    ),
    # -- ALiBi -------------------------------------------------------------------------------------------
    Mutant(
        "alibi_slopes_of_kv_head", "alibi_slopes",
        "Each query head takes the slope of its key/value head (off_h // group) instead of its own: with GQA "
        "the heads of a group share the first one's slope.",
        ((_SLOPE, _SLOPE.replace("off_h * stride_sh", "off_hkv * stride_sh")),),
        "ALiBi with GQA (Hq = 2, Hkv = 1) and unequal slopes (0.25 and 1).",
    ),
    Mutant(
        "alibi_top_left", "alibi_slopes",
        "The symmetric ALiBi is aligned top-left, -slope |i - j|, instead of bottom-right, -slope |i + Nk - Nq - j| "
        "(flash-attention's): with Nq != Nk each query's bias peaks at the wrong key.",
        (("alibi_offset(alibi, Nq, Nk),", "0,"),),
        "ALiBi with Nq != Nk (e.g. Nq = 24, Nk = 40, slopes 0.25 and 1).",
    ),
    Mutant(
        "alibi_distance_off_by_one", "alibi_slopes",
        "The query's position is taken one past i + Nk - Nq (a 1-based position): each bias peaks one key "
        "right of the query's own, and the keys left of it lose slope more.",
        (("_alibi(offs_m + alibi_offset, cols,", "_alibi(offs_m + alibi_offset + 1, cols,"),),
        "ALiBi with slopes large enough to matter (e.g. 0.25 and 1), any lengths.",
    ),
    Mutant(
        "alibi_in_base_e", "alibi_slopes",
        "The slope is used in the kernel's base-2 domain without the log2(e) factor: every ALiBi bias is ln 2 "
        "times too small.",
        ((_SLOPE, _SLOPE.replace(" * 1.4426950408889634", "")),),
        "ALiBi with slopes of the size of the logits' spread (e.g. 0.25 and 1).",
    ),
    # -- attn_bias ---------------------------------------------------------------------------------------
    Mutant(
        "bias_times_scale", "attn_bias",
        "The bias is multiplied by the softmax scale, as if added to q.k before the scaling: scale (q.k + b) "
        "instead of scale q.k + b.",
        ((_ADD_BIAS, _ADD_BIAS.replace("b * 1.4426950408889634", "b * qk_scale")),),
        "attn_bias with scale != 1 (scale = 0.5, a bias of random normals).",
    ),
    Mutant(
        "bias_before_cap", "attn_bias",
        "The biases are added before the soft-cap, c tanh((s + b) / c) (bias_first), while the spec declares "
        "cap_first, c tanh(s / c) + b.",
        ((_CAP_BLOCK, ""), (_ADD_BIAS, _ADD_BIAS + _CAP_BLOCK)),
        "attn_bias with a soft-cap of the size of the biased logits (c = 2, a bias of random normals).",
        features=("softcap",),
    ),
    Mutant(
        "bias_batch_stride_ignored", "attn_bias",
        "The bias's batch stride is left out: every batch entry reads batch 0's bias.",
        (("b_base = Bias + off_b.to(tl.int64) * stride_bb + off_h.to(tl.int64) * stride_bh",
          "b_base = Bias + off_h.to(tl.int64) * stride_bh"),),
        "A bias of its own per batch entry, e.g. of shape (B, 1, Nq, Nk) with B = 2.",
    ),
    Mutant(
        "bias_transposed", "attn_bias",
        "The bias tile is read with its row and key strides swapped, b[j, i] for b[i, j]: a square bias comes "
        "out transposed, a per-key bias (Nq broadcast) becomes one constant per row, which the softmax ignores.",
        (("_bias(b_base, offs_m, cols, stride_bm, stride_bn, row_ok, col_ok)",
          "_bias(b_base, offs_m, cols, stride_bn, stride_bm, row_ok, col_ok)"),),
        "A bias of shape (1, Hq, 1, Nk), or a square one, with Nq = Nk.",
    ),
    Mutant(
        "bias_finite_sentinel", "attn_bias",
        "-inf bias entries are clamped to the finite sentinel -1e30 (to keep exp2 clear of -inf) and no longer "
        "hide their keys: a row the bias hides entirely gets uniform weights, out = the mean of V, not 0.",
        ((_BIAS_HIDES, ""), (_ADD_BIAS, "            s = s + tl.maximum(b, -1.0e30) * 1.4426950408889634\n")),
        "A bias of -inf entries with a row it hides entirely.",
    ),
    # -- sliding window ----------------------------------------------------------------------------------
    Mutant(
        "window_left_edge_short", "window",
        "The window's left test uses > instead of >=: each query misses the leftmost key of its window.",
        ((_WINDOW_LEFT, _WINDOW_LEFT.replace(">=", ">")),),
        "A window with a bounded left side that keys fill, e.g. window = (4, 0) with Nq = Nk = 40.",
    ),
    Mutant(
        "window_right_edge_past", "window",
        "The window's right bound is one key too far: each query also sees the key right of its window "
        "(but where the tile skip stops before it).",
        ((_WINDOW_RIGHT, "(cols[None, :] <= centre + window_right + 1)"),),
        "A window with a bounded right side short of the last key, e.g. window = (4, 2) with Nq = Nk = 40.",
    ),
    Mutant(
        "window_top_left", "window",
        "The window is aligned top-left (centred on key i) instead of bottom-right (key i + Nk - Nq), "
        "unlike flash-attention's window_size.",
        (("centre = offs_m[:, None] + diagonal", "centre = offs_m[:, None]"),),
        "A window with Nq != Nk (e.g. window = (4, 2), Nq = 24, Nk = 40).",
    ),
    Mutant(
        "window_unbounded_side_literal", "window",
        "The host takes a left side of -1 literally instead of as unbounded: the window's left edge lands "
        "right of the query's own key, so the query sees only keys past it, or nothing.",
        (("n_k if left < 0 else min(left, n_k)", "min(left, n_k)"),),
        "window = (-1, r) (unbounded on the left), e.g. (-1, 2) with Nq = Nk = 40.",
    ),
    Mutant(
        "window_skip_off_by_one", "window",
        "The window's tile-skip bound forgets the +1, so when the last key a query tile may see starts a "
        "key tile that tile is skipped.",
        (("last_row + diagonal + window_right + 1, 0)", "last_row + diagonal + window_right, 0)"),),
        "window = (w, 0) with Nq = Nk = 2 * block + 1 (the last row's own key starts a key tile).",
    ),
    # -- chunked attention -------------------------------------------------------------------------------
    Mutant(
        "chunk_top_left", "chunk",
        "The query's chunk is taken from its index i instead of its position i + Nk - Nq (top-left "
        "aligned), so with Nq != Nk queries see another chunk's keys.",
        (("pos = offs_m + diagonal", "pos = offs_m"),),
        "chunk with Nq != Nk, Nk - Nq not a multiple of the chunk (e.g. chunk = 8, Nq = 24, Nk = 40).",
    ),
    Mutant(
        "chunk_end_inclusive", "chunk",
        "The chunk's end test uses <= instead of <: each query also sees the first key of the next chunk.",
        (("(cols[None, :] < first[:, None] + chunk)", "(cols[None, :] <= first[:, None] + chunk)"),),
        "chunk shorter than Nk (e.g. chunk = 8, Nq = Nk = 40).",
    ),
    Mutant(
        "chunk_negative_positions_in_first_chunk", "chunk",
        "The test for positions before the first key is dropped: // truncates toward zero, so with Nq > Nk "
        "the rows whose position i + Nk - Nq lies in (-chunk, 0) see chunk 0's keys instead of none.",
        (("visible = visible & (pos[:, None] >= 0) & (cols[None, :] >= first[:, None])",
          "visible = visible & (cols[None, :] >= first[:, None])"),),
        "chunk with Nq > Nk (e.g. chunk = 8, Nq = 50, Nk = 20).",
    ),
    # -- attention sinks ---------------------------------------------------------------------------------
    Mutant(
        "sink_ignored", "sinks",
        "The sink raises the running max but never joins the sum: every row is normalised over its keys "
        "alone, as without a sink.",
        (("l_i = l_i * beta + tl.math.exp2(sink2 - m_fsub)", "l_i = l_i * beta"),),
        "Finite sinks of the size of the logits (e.g. sinks 0.5 and 2, random Q, K, V).",
    ),
    Mutant(
        "sink_in_base_2", "sinks",
        "The sink (a natural-log logit) is used as a base-2 logit, without the log2(e) factor: its weight "
        "is 2^sink instead of e^sink.",
        (("tl.load(Sinks + off_h) * 1.4426950408889634", "tl.load(Sinks + off_h)"),),
        "Sinks other than 0 (e.g. sinks 2 and -1.5).",
    ),
    Mutant(
        "sink_max_not_updated", "sinks",
        "l and acc are rescaled to max(m, sink) but m keeps the keys' max: lse is off by (sink - max) where "
        "the sink is the larger, and a row with no visible key gets lse = -inf instead of the sink.",
        (("        m_i = m_fin\n", ""),),
        "A sink above a row's top logit (e.g. sink 4 with small logits), or a row with no visible key, "
        "comparing lse.",
    ),
    Mutant(
        "sink_empty_row_nan", "sinks",
        "The guard on the final max is removed: a row with no visible key in a head whose sink is -inf "
        "computes exp2(-inf - -inf) = NaN.",
        (('m_fsub = tl.where(m_fin == float("-inf"), 0.0, m_fin)', "m_fsub = m_fin"),),
        "A sink of -inf in a head with a row that sees no key (a mask's all-False row, or bottom_right "
        "with Nq > Nk).",
    ),
)

_BACKWARD_WINDOW = ("    if has_window:\n"
                    "        centre = offs_m[:, None] + diagonal\n"
                    "        visible = visible & (cols[None, :] >= centre - window_left) & (cols[None, :] <= centre "
                    "+ window_right)\n")
_DSINKS = "    return -(p * delta).sum(dim=(0, 2)).to(sinks.dtype)"
_BACKWARD_CAP = "    if has_softcap:\n        t = _tanh(s / softcap2)\n        s = softcap2 * t\n"
_BACKWARD_ALIBI = "    if has_alibi:\n        s = s + alibi2\n"
_BACKWARD_BIAS = "    if HAS_BIAS:\n        s = s + bias2\n"

VARIANT_BACKWARD_MUTANTS: tuple[Mutant, ...] = (
    backward_mutant(
        "softcap_derivative_missing", "softcap",
        "dS is not multiplied by the cap's derivative 1 - tanh^2(s / c): dQ and dK are those of uncapped "
        "logits.",
        (("    if has_softcap:\n        ds = ds * (1.0 - t * t)  # d(c tanh(s / c)) / ds\n", ""),),
        "softcap with logits near the cap, where tanh' is well below 1 (c = 1, scale = 0.5), random dO.",
    ),
    backward_mutant(
        "softcap_missing_in_recomputation", "softcap",
        "The backward recomputes P from the uncapped logits, while the saved lse is that of the capped "
        "ones: P no longer sums to 1, and dV, dQ, dK are off.",
        (("        s = softcap2 * t\n", ""),),
        "softcap with logits near the cap (c = 1, scale = 0.5), random dO.",
    ),
    backward_mutant(
        "alibi_missing_backward", "alibi_slopes",
        "The backward recomputes P without ALiBi, while the saved lse holds it: P no longer sums to 1, and dV, "
        "dQ, dK are off.",
        ((_BACKWARD_ALIBI, ""),),
        "ALiBi with slopes that matter (e.g. 0.25 and 1), random dO.",
    ),
    backward_mutant(
        "alibi_slopes_of_kv_head_backward", "alibi_slopes",
        "The dK/dV kernel, looping over a group's query heads, takes each one's slope at the key/value head's "
        "index: dK and dV of GQA groups use the first head's slope.",
        (("        " + _SLOPE, "        " + _SLOPE.replace("off_h * stride_sh", "off_hkv * stride_sh")),),
        "ALiBi with GQA (Hq = 2, Hkv = 1) and unequal slopes (0.25 and 1), random dO.",
    ),
    backward_mutant(
        "alibi_top_left_backward", "alibi_slopes",
        "The backward aligns the symmetric ALiBi top-left (-slope |i - j|), the forward bottom-right: with "
        "Nq != Nk the recomputed P is not the forward's.",
        (("alibi_offset(alibi, Nq, Nk), *(int(", "0, *(int("),),
        "ALiBi with Nq != Nk (e.g. Nq = 24, Nk = 40), random dO.",
    ),
    backward_mutant(
        "bias_missing_backward", "attn_bias",
        "The backward recomputes P without attn_bias, while the saved lse holds it: P no longer sums to 1, and "
        "dV, dQ, dK are off (and keys the bias hides by -inf still do, through `visible`).",
        ((_BACKWARD_BIAS, ""),),
        "attn_bias of random normals, random dO.",
    ),
    backward_mutant(
        "bias_before_cap_backward", "attn_bias",
        "The backward adds the biases before the soft-cap (bias_first), the forward after it (cap_first): P and "
        "the cap's slope 1 - tanh^2 are taken at the wrong logits.",
        ((_BACKWARD_CAP + _BACKWARD_ALIBI + _BACKWARD_BIAS, _BACKWARD_ALIBI + _BACKWARD_BIAS + _BACKWARD_CAP),),
        "attn_bias with a soft-cap of the size of the biased logits (c = 2), random dO.",
        features=("softcap",),
    ),
    backward_mutant(
        "bias_batch_stride_ignored_backward", "attn_bias",
        "Both backward kernels leave out the bias's batch stride: every batch entry recomputes P with batch "
        "0's bias.",
        (("\n        b_base = _head(Bias, off_b, off_h, stride_bb, stride_bh)",
          "\n        b_base = _head(Bias, off_b, off_h, 0, stride_bh)"),
         ("\n    b_base = _head(Bias, off_b, off_h, stride_bb, stride_bh)",
          "\n    b_base = _head(Bias, off_b, off_h, 0, stride_bh)")),
        "A bias of its own per batch entry, e.g. of shape (B, 1, Nq, Nk) with B = 2, random dO.",
    ),
    backward_mutant(
        "window_missing_backward", "window",
        "The backward forgets the window: keys outside a query's window get P = exp(s - lse) > 0, and "
        "gradient in dK and dV.",
        ((_BACKWARD_WINDOW, ""),),
        "A window hiding keys (e.g. window = (4, 2) with Nq = Nk = 40), random dO.",
    ),
    backward_mutant(
        "window_left_edge_short_backward", "window",
        "The backward's window test uses > instead of >= on the left: the leftmost key of each query's window "
        "gets P = 0 in the recomputation while the forward gave it weight, so its dK and dV lose that share.",
        (("(cols[None, :] >= centre - window_left)", "(cols[None, :] > centre - window_left)"),),
        "A window with a bounded left side that keys fill, e.g. window = (4, 0) with Nq = Nk = 40, random dO.",
    ),
    backward_mutant(
        "chunk_end_inclusive_backward", "chunk",
        "The backward's chunk end test uses <= instead of <: each query's recomputed P also covers the first "
        "key of the next chunk, which the forward hid, and that key gets gradient.",
        (("(cols[None, :] < first[:, None] + chunk)", "(cols[None, :] <= first[:, None] + chunk)"),),
        "chunk shorter than Nk (e.g. chunk = 8, Nq = Nk = 40), random dO.",
    ),
    backward_mutant(
        "chunk_top_left_backward", "chunk",
        "The backward takes a query's chunk from its index i instead of its position i + Nk - Nq, unlike "
        "the forward.",
        (("pos = offs_m + diagonal", "pos = offs_m"),),
        "chunk with Nq != Nk, Nk - Nq not a multiple of the chunk (e.g. chunk = 8, Nq = 24, Nk = 40).",
    ),
    backward_mutant(
        "dsinks_sign_flipped", "sinks",
        "The sinks' gradient has its sign flipped: +sum P(sink) D instead of -sum P(sink) D.",
        ((_DSINKS, _DSINKS.replace("return -(", "return (")),),
        "Sinks that require grad, of the size of the logits, random dO.",
    ),
    backward_mutant(
        "dsinks_in_base_2", "sinks",
        "The sinks' gradient takes P(sink) as 2^(sink - lse) instead of e^(sink - lse), mixing the natural "
        "log of the sink and lse with the kernels' base 2.",
        (("p = torch.exp(sinks.detach()", "p = torch.exp2(sinks.detach()"),),
        "Sinks that require grad, away from their rows' lse (e.g. sinks 0.5 and 2), random dO.",
    ),
)
