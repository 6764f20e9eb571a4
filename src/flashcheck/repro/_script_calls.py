"""The kernel calls of the built-in PyTorch kernels in a reproducer (see :mod:`flashcheck.repro.script`): PyTorch's
public API as flashcheck's adapters call it (:mod:`flashcheck.kernels.sdpa`, :mod:`flashcheck.kernels.flex`).
The functions a case needs are copied into its script; what comes before the line ``# ---- calls ----`` is not.
A flex script also gets :func:`flashcheck.kernels.flex.flex_sink_key`, the adapter's own, copied from its source."""

import math

import torch

from ..kernels.flex import flex_sink_key  # noqa: F401  (script.py copies its source in, after these calls)
from ._script import CASE, as_4d, causal_visible, scale

# ---- calls ----


def sdpa_float_mask(kw, mask, shape, dtype, device):
    """SDPA's float attn_mask: attn_bias plus symmetric ALiBi, -inf where the mask or the causal alignment hides
    a key (SDPA takes one mask). fp32 where ALiBi is used or the bias is fp32, else the inputs' dtype."""
    nq, nk = shape[2], shape[3]
    bias, slopes = kw.get("attn_bias"), kw.get("alibi_slopes")
    wide = slopes is not None or (bias is not None and bias.dtype == torch.float32)
    out = torch.zeros((), dtype=torch.float32 if wide else dtype, device=device)
    if slopes is not None:  # -slope |i + Nk - Nq - j|
        i = torch.arange(nq, device=device).view(-1, 1)
        distance = (i + (nk - nq) - torch.arange(nk, device=device)).abs().float()
        slopes = slopes.to(device, torch.float32)
        out = -slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * distance
    if bias is not None:
        out = out + as_4d(bias.to(device))
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
        if "attn_bias" in kw or "alibi_slopes" in kw:
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
    """The mask_mod of the causal alignment, window, chunk and boolean mask, and the block mask's B and H."""
    mods, B, H = [], None, None
    nq, nk = full[2], full[3]
    offset = torch.tensor(nk - nq, device=device)  # bottom-right alignment, a tensor: no recompile per offset
    if CASE["causal"] != "none":
        shift = offset if CASE["causal"] == "bottom_right" else torch.tensor(0, device=device)
        mods.append(lambda b, h, q_idx, kv_idx: kv_idx <= q_idx + shift)
    if "window" in kw:
        left, right = (torch.tensor(w, device=device) if w >= 0 else None for w in kw["window"])

        def window_mod(b, h, q_idx, kv_idx):
            out = torch.ones_like(q_idx - kv_idx, dtype=torch.bool)
            out = out if left is None else out & (kv_idx >= q_idx + offset - left)
            return out if right is None else out & (kv_idx <= q_idx + offset + right)

        mods.append(window_mod)
    if "chunk" in kw:
        size = torch.tensor(kw["chunk"], device=device)
        mods.append(lambda b, h, q_idx, kv_idx: torch.div(q_idx + offset, size, rounding_mode="floor")
                    == torch.div(kv_idx, size, rounding_mode="floor"))
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


def flex_score_mod(device, full, kw, alibi):
    """The score_mod: soft-cap, then ALiBi, then attn_bias (flash-attention's order); None without them."""
    cap = kw.get("softcap")
    cap = torch.tensor(cap, dtype=torch.float32, device=device) if cap not in (None, math.inf) else None
    slopes = kw.get("alibi_slopes")
    slopes = None if slopes is None else slopes.to(device, torch.float32).expand(full[:2])
    bias = None if kw.get("attn_bias") is None else kw["attn_bias"].to(device).expand(full)
    if cap is None and slopes is None and bias is None:
        return None
    offset = torch.tensor(full[3] - full[2], device=device)

    def score_mod(score, b, h, q_idx, kv_idx):
        if cap is not None:
            score = cap * torch.tanh(score / cap)
        if slopes is not None and alibi == "linear":  # slope (j - i)
            score = score + slopes[b, h] * (kv_idx - q_idx)
        elif slopes is not None:  # -slope |i + Nk - Nq - j|
            score = score - slopes[b, h] * (q_idx + offset - kv_idx).abs()
        if bias is not None:
            score = score + bias[b, h, q_idx, kv_idx]
        return score

    return score_mod


def flex_call(target):
    # here: a reproducer copies this function without the module's imports
    from torch.nn.attention import flex_attention as fa

    spec = CASE["kernel"]

    def call(q, k, v, mask, kw):
        nq, nk, gqa = q.shape[2], k.shape[2], q.shape[1] != k.shape[1]
        captures = CASE["causal"] != "none" or mask is not None or any(n in kw for n in ("window", "chunk", "sinks"))
        scores = any(n in kw for n in ("softcap", "alibi_slopes", "attn_bias"))
        if gqa and spec["compile"] and q.is_cuda and (captures or scores):
            # inductor failed to compile flex's GQA decoding kernel with captured tensors: K, V repeated
            k, v = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (k, v))
            gqa = False
        full = (q.shape[0], q.shape[1], nq, nk)
        mask_mod, B, H = flex_mask_mod(fa, q.device, full, mask, kw)
        score_mod = flex_score_mod(q.device, full, kw, spec["alibi"])
        if "sinks" in kw:
            k, v, mask_mod, score_mod = flex_sink_key(k, v, mask_mod, score_mod, kw["sinks"])
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
