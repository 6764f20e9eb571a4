"""The kernel calls of the built-in PyTorch kernels in a reproducer (see :mod:`flashcheck.repro.script`): PyTorch's
public API as flashcheck's adapters call it (:mod:`flashcheck.kernels.sdpa`, :mod:`flashcheck.kernels.flex`).
The functions a case needs are copied into its script; what comes before the line ``# ---- calls ----`` is not.
A flex script also gets :func:`flashcheck.kernels.flex.flex_sink_key`, the adapter's own, copied from its source.
The variant reaches them through the script's tables of its terms (CAPS, BIASES, MASK_MODS, SINK_LOGITS and
SCORE_MODS: see :mod:`flashcheck.repro._script`)."""

import math

import torch

from ..kernels.flex import flex_sink_key  # noqa: F401  (script.py copies its source in, after these calls)
from ._script import (BIASES, CAPS, CASE, MASK_MODS, SCORE_MODS, SINK_LOGITS, as_4d, causal_visible, scale,
                      score_bias)

# ---- calls ----


def sdpa_float_mask(kw, mask, shape, dtype, device):
    """SDPA's float attn_mask: the variant's biases (BIASES) summed, -inf where the mask or the causal alignment hides
    a key (SDPA takes one mask). fp32 where a bias is given in fp32, else the inputs' dtype."""
    nq, nk = shape[2], shape[3]
    wide = any(kw[n].dtype == torch.float32 for n in BIASES if n in kw)
    out = score_bias(nq, nk, device, kw, torch.float32 if wide else dtype)
    vis = causal_visible(CASE["causal"], nq, nk, device)
    if mask is not None:
        vis = vis & as_4d(mask)
    return torch.where(vis, out, torch.tensor(-math.inf, dtype=out.dtype, device=device)).expand(shape)


def sdpa_call(target):
    # here: a reproducer copies this function without the module's imports
    from torch.nn.attention import SDPBackend, sdpa_kernel

    spec, causal = CASE["kernel"], CASE["causal"]

    def call(q, k, v, mask, kw):
        nq, nk = q.shape[2], k.shape[2]
        gqa = q.shape[1] != k.shape[1]
        if gqa and spec["repeat_kv"]:  # this backend refuses enable_gqa: K and V repeated (an exact copy)
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
            gqa = False
        if spec["fused"]:  # fused backends refuse a last dimension that is not unit-stride
            q, k, v = (t if t.size(-1) == 1 or t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        kwargs = {"scale": scale()}
        if gqa:
            kwargs["enable_gqa"] = True
        if any(n in kw for n in BIASES):
            kwargs["attn_mask"] = sdpa_float_mask(kw, mask, (q.shape[0], q.shape[1], nq, nk), q.dtype, q.device)
        elif mask is not None:  # SDPA takes a mask or is_causal: the causal mask joins the boolean one
            kwargs["attn_mask"] = as_4d(mask) & causal_visible(causal, nq, nk, q.device)
        elif causal == "top_left" or (causal == "bottom_right" and nq == nk):
            kwargs["is_causal"] = True  # where Nq == Nk the two alignments coincide
        elif causal == "bottom_right" and spec["native_lower_right"]:
            from torch.nn.attention.bias import causal_lower_right  # imports torch._dynamo: only when used

            kwargs["attn_mask"] = causal_lower_right(nq, nk)
        elif causal == "bottom_right":
            kwargs["attn_mask"] = torch.ones(nq, nk, dtype=torch.bool, device=q.device).tril(nk - nq)
        wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        with torch.set_grad_enabled(wants_grad), sdpa_kernel(getattr(SDPBackend, spec["backend"])):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs)

    return call


def flex_mask_mod(fa, device, full, mask, kw):
    """The mask_mod of the causal alignment, each of MASK_MODS and the boolean mask, and the block mask's B and H."""
    mods, B, H = [], None, None
    nq, nk = full[2], full[3]
    offset = torch.tensor(nk - nq, device=device)  # bottom-right alignment, a tensor: no recompile per offset
    if CASE["causal"] != "none":
        shift = offset if CASE["causal"] == "bottom_right" else torch.tensor(0, device=device)
        mods.append(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + shift)
    for name, mask_mod in MASK_MODS.items():
        mods.append(mask_mod(kw[name], offset, device))
    if mask is not None:
        m = as_4d(mask)
        # Size-1 batch or head dimensions of the mask broadcast: the block mask need not repeat them.
        B, H = (full[0] if m.shape[0] > 1 else None), (full[1] if m.shape[1] > 1 else None)
        pick = lambda i, n: i if n > 1 else torch.zeros_like(i)  # noqa: E731  (size-1 dimensions broadcast)
        mods.append(lambda b, h, q_idx, kv_idx: m[pick(b, m.shape[0]), pick(h, m.shape[1]),
                                                   pick(q_idx, m.shape[2]), pick(kv_idx, m.shape[3])])
    if not mods:
        return None, None, None
    return (mods[0] if len(mods) == 1 else fa.and_masks(*mods)), B, H


def flex_score_mod(device, full, kw):
    """The score_mod: the cap (CAPS), then each term of SCORE_MODS (flash-attention's order); None without them."""
    cap = next((kw[n] for n in CAPS if n in kw), None)
    cap = torch.tensor(cap, dtype=torch.float32, device=device) if cap not in (None, math.inf) else None
    offset = torch.tensor(full[3] - full[2], device=device)
    terms = [term(kw[name].to(device), full, offset, CASE["settings"]) for name, term in SCORE_MODS.items()]
    if cap is None and not terms:
        return None

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        for term in terms:
            score = term(score, b, h, q_idx, kv_idx)
        return score

    return score_mod


def flex_call(target):
    # here: a reproducer copies this function without the module's imports
    from torch.nn.attention import flex_attention as fa

    spec = CASE["kernel"]

    def call(q, k, v, mask, kw):
        nq, nk, gqa = q.shape[2], k.shape[2], q.shape[1] != k.shape[1]
        captures = CASE["causal"] != "none" or mask is not None or any(n in kw for n in (*MASK_MODS, *SINK_LOGITS))
        scores = any(n in kw for n in (*CAPS, *SCORE_MODS))
        if gqa and spec["compile"] and q.is_cuda and (captures or scores):
            # inductor failed to compile flex's GQA decoding kernel with captured tensors: K, V repeated
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
            gqa = False
        full = (q.shape[0], q.shape[1], nq, nk)
        mask_mod, B, H = flex_mask_mod(fa, q.device, full, mask, kw)
        score_mod = flex_score_mod(q.device, full, kw)
        sink = next((kw[n] for n in SINK_LOGITS if n in kw), None)
        if sink is not None:
            k, v, mask_mod, score_mod = flex_sink_key(k, v, mask_mod, score_mod, sink)
        block_mask = None if mask_mod is None else fa.create_block_mask(mask_mod, B, H, nq, k.shape[2],
                                                                         device=q.device)
        fn = fa.flex_attention
        if spec["compile"]:
            fn = torch.compile(fn, dynamic=False if q.device.type == "cpu" else None)
        kwargs = {"scale": scale(), "enable_gqa": gqa}
        if spec["returns_lse"] and hasattr(fa, "AuxRequest"):
            kwargs["return_aux"] = fa.AuxRequest(lse=True)
        elif spec["returns_lse"]:  # torch < 2.9
            kwargs["return_lse"] = True
        with torch.no_grad():
            result = fn(q, key=k, value=v, block_mask=block_mask, score_mod=score_mod, **kwargs)
        return (result[0], getattr(result[1], "lse", result[1])) if spec["returns_lse"] else result

    return call
