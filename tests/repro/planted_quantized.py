"""A plain-callable MXFP8 attention kernel with a planted bug, and its fixed twin, for the reproducer tests: e4m3
codes times their e8m0 block scales (32 dims of a token for q and k, 32 tokens of a dim for v), fp32 softmax, the
output in bf16. The bug reads k's e8m0 scales as e4m3 bits. They import nothing of flashcheck."""

import torch


def _values(codes, scales, along_dims):
    s = scales.float()
    s = s.repeat_interleave(32, -1)[..., :codes.shape[-1]] if along_dims else s.repeat_interleave(32, 2)[:, :, :codes.shape[2]]
    return codes.float() * s


def _attention(q, k, v, *, scale, q_block_scales, k_block_scales, v_block_scales, misread):
    k_scales = k_block_scales.view(torch.uint8).view(torch.float8_e4m3fn) if misread else k_block_scales
    q, k = _values(q, q_block_scales, True), _values(k, k_scales, True)
    v = _values(v, v_block_scales, False)
    p = torch.softmax((q @ k.transpose(-1, -2)) * scale, -1)
    return (p @ v).to(torch.bfloat16)


def mx_fixed(q, k, v, *, scale, causal="none", attn_mask=None, q_block_scales, k_block_scales, v_block_scales):
    return _attention(q, k, v, scale=scale, q_block_scales=q_block_scales, k_block_scales=k_block_scales,
                      v_block_scales=v_block_scales, misread=False)


def mx_e8m0_as_e4m3(q, k, v, *, scale, causal="none", attn_mask=None, q_block_scales, k_block_scales,
                    v_block_scales):
    return _attention(q, k, v, scale=scale, q_block_scales=q_block_scales, k_block_scales=k_block_scales,
                      v_block_scales=v_block_scales, misread=True)
