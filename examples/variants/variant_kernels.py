"""A plain PyTorch attention kernel with soft-capping, ALiBi, an additive bias, a sliding window, chunks and
sinks, and copies of it with one defect each, as kernel authors write them.

Each kernel follows flashcheck's calling convention: ``kernel(q, k, v, *, scale, causal, attn_mask=None,
softcap=None, alibi_slopes=None, attn_bias=None, window=None, chunk=None, sinks=None) -> (out, lse)``; the
spec declares which variant keywords it takes (ALiBi symmetric, as flash-attention's; an fp32 bias taken
too; the cap before the bias). Campaigns (from the repository root, the CPU is enough):

    PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:correct --device cpu --preset adversarial --max-examples 200 --seed 1
    PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:cap_unscaled --device cpu --preset adversarial --seed 1
    PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:window_short --device cpu --preset adversarial --seed 1
    PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:sinks_ignored --device cpu --preset adversarial --seed 1
    for k in alibi_top_left bias_scaled bias_one_head; do
      PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:$k --device cpu --preset adversarial --seed 1
    done

The first passes (its campaigns draw ALiBi and attn_bias too, as the three bias bugs' do, the others' not);
each of the others is a BUG whose diagnosis names its defect. Autograd differentiates them (``--backward``):
``cap_slope_dropped`` is right forward and wrong backward, where it treats the cap's slope as 1 (a
straight-through cap):

    PYTHONPATH=examples/variants flashcheck fuzz variant_kernels:cap_slope_dropped --device cpu --preset adversarial --backward --seed 1
"""

from __future__ import annotations

import math

import torch

import flashcheck

SPEC = dict(dtypes=("fp16", "bf16", "fp32"), causal=("none", "top_left", "bottom_right"), attn_mask=True,
            gqa=True, dv_equals_d=False, fully_masked_rows="zero", precision="upcast", softcap=True,
            window=True, chunk=True, sinks=True, neutral_variants=True, backward=True,
            nan_safe_masking=True)  # it reads no key that no query sees (see _attention)
# The kernels with a bias: campaigns of the others draw the cases they drew before ALiBi and attn_bias.
BIAS_SPEC = dict(SPEC, alibi="symmetric", attn_bias=True, fp32_bias=True, bias_order="cap_first")


def _visible(n_q: int, n_k: int, *, causal, window, chunk, shorten_window: int = 0) -> torch.Tensor:
    i = torch.arange(n_q).view(-1, 1)
    j = torch.arange(n_k).view(1, -1)
    centre = i + n_k - n_q  # windows and chunks are bottom-right aligned, as flash-attention's
    vis = torch.ones(n_q, n_k, dtype=torch.bool)
    if causal != "none":
        vis &= j <= (i if causal == "top_left" else centre)
    if window is not None:
        left, right = window
        if left >= 0:
            vis &= j >= centre - left + shorten_window
        if right >= 0:
            vis &= j <= centre + right
    if chunk is not None:
        vis &= torch.div(centre, chunk, rounding_mode="floor") == torch.div(j, chunk, rounding_mode="floor")
    return vis


def _bias(n_q: int, n_k: int, device, *, alibi_slopes, attn_bias, defect) -> torch.Tensor | None:
    """ALiBi (flash-attention's symmetric, bottom-right aligned) plus attn_bias, fp32, or None."""
    out = None
    if alibi_slopes is not None:
        i = torch.arange(n_q, device=device).view(-1, 1) + (0 if defect == "alibi_top_left" else n_k - n_q)
        distance = (i - torch.arange(n_k, device=device).view(1, -1)).abs().float()
        slopes = alibi_slopes.to(device, torch.float32)
        out = -slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * distance
    if attn_bias is not None:
        bias = attn_bias.to(device, torch.float32)
        bias = bias.reshape((1,) * (4 - bias.dim()) + tuple(bias.shape))
        if defect == "bias_one_head":
            bias = bias[:, :1]
        out = bias if out is None else out + bias
    return out


def _attention(q, k, v, *, scale, causal, attn_mask=None, softcap=None, alibi_slopes=None, attn_bias=None,
               window=None, chunk=None, sinks=None, defect=None):
    group = q.shape[1] // k.shape[1]
    # fp32 before the heads are repeated: autograd then sums the group's dK and dV in fp32, not in fp16
    # (where one head's share can pass 65,504 while their sum does not).
    k, v = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    logits = q.float() @ k.transpose(-1, -2)
    capped = softcap is not None and softcap != math.inf
    early = None
    if attn_bias is not None and defect == "bias_scaled":  # attn_bias added before the scale: (q . k + bias) scale
        early = _bias(q.shape[2], k.shape[2], q.device, alibi_slopes=None, attn_bias=attn_bias, defect=defect)
        logits, attn_bias = logits + early, None
    bias = _bias(q.shape[2], k.shape[2], q.device, alibi_slopes=alibi_slopes, attn_bias=attn_bias, defect=defect)
    if capped and defect == "cap_unscaled":
        logits = softcap * torch.tanh(logits / softcap) * scale
    else:
        logits = logits * scale
        if capped and defect == "cap_slope_dropped":  # the capped value, the gradient of no cap
            logits = logits + (softcap * torch.tanh(logits / softcap) - logits).detach()
        elif capped:
            logits = softcap * torch.tanh(logits / softcap)
    if bias is not None:  # cap first, then the bias (bias_order="cap_first", flash-attention's)
        logits = logits + bias
    vis = _visible(q.shape[2], k.shape[2], causal=causal, window=window, chunk=chunk,
                   shorten_window=1 if defect == "window_short" else 0).to(q.device)
    if attn_mask is not None:
        vis = vis & attn_mask
    for hiding in (bias, early):  # a key the bias hides (-inf) is not read either
        if hiding is not None:
            vis = vis & (hiding != -math.inf)
    vis = vis.expand(logits.shape)
    logits = logits.masked_fill(~vis, -math.inf)
    top = logits.amax(-1, keepdim=True)
    sink = None if sinks is None or defect == "sinks_ignored" else sinks.float().view(1, -1, 1, 1)
    if sink is not None:
        top = torch.maximum(top, sink)
    top = torch.where(top == -math.inf, 0.0, top)  # a row with nothing visible
    p = torch.exp(logits - top)
    total = p.sum(-1, keepdim=True) + (0.0 if sink is None else torch.exp(sink - top))
    # Keys no query sees are not read: NaN padding there must not reach the output through 0 * NaN.
    v = v.masked_fill(~vis.any(-2)[..., None], 0.0)
    out = (p @ v) / torch.where(total == 0, 1.0, total)
    lse = torch.where(total == 0, -math.inf, top + torch.log(total))[..., 0]
    return out.to(q.dtype), lse


def _kernel(defect: str | None, spec: dict = SPEC):
    def attention(q, k, v, *, scale, causal, attn_mask=None, **variant):
        return _attention(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, defect=defect, **variant)

    attention.__qualname__ = attention.__name__ = defect or "correct"
    return flashcheck.kernel(attention, name=f"variant_kernels:{attention.__name__}", **spec)


correct = _kernel(None, BIAS_SPEC)
cap_unscaled = _kernel("cap_unscaled")  # the cap on q . k before the scale: tanh(q.k / c) c scale
window_short = _kernel("window_short")  # the window's left edge one key short: i + Nk - Nq - left + 1
sinks_ignored = _kernel("sinks_ignored")  # the sink left out of the softmax's sum
cap_slope_dropped = _kernel("cap_slope_dropped")  # backward: dS not multiplied by 1 - tanh^2(s / c)
alibi_top_left = _kernel("alibi_top_left", BIAS_SPEC)  # ALiBi's distance |i - j| (top-left): wrong where Nq != Nk
bias_scaled = _kernel("bias_scaled", BIAS_SPEC)  # attn_bias multiplied by the softmax scale: (q . k + bias) scale
bias_one_head = _kernel("bias_one_head", BIAS_SPEC)  # every head reads head 0's attn_bias (a broadcast gone wrong)
