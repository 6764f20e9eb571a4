"""Plain-callable MXFP8 and NVFP4 attention kernels with a planted bug each, and their fixed twins, for the
reproducer tests: codes times their block scales (32 (MXFP8) or 16 (NVFP4) dims of a token for q and k, as many
tokens of a dim for v) and NVFP4's global scales, fp32 softmax, the output in bf16. The bugs read k's e8m0 scales as
e4m3 bits and leave out k's global scale. They import nothing of flashcheck."""

import torch


def _values(codes, scales, along_dims, size=32):
    s = scales.float()
    s = s.repeat_interleave(size, -1)[..., :codes.shape[-1]] if along_dims else s.repeat_interleave(size, 2)[:, :, :codes.shape[2]]
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


def _nvfp4(q, k, v, *, scale, block_scales, global_scales):
    q, k, v = (_values(t, s, axis, 16) * g.float() for t, s, g, axis in
               zip((q, k, v), block_scales, global_scales, (True, True, False)))
    return (torch.softmax((q @ k.transpose(-1, -2)) * scale, -1) @ v).to(torch.bfloat16)


def nvfp4_fixed(q, k, v, *, scale, causal="none", attn_mask=None, q_block_scales, k_block_scales, v_block_scales,
                q_global_scale, k_global_scale, v_global_scale):
    return _nvfp4(q, k, v, scale=scale, block_scales=(q_block_scales, k_block_scales, v_block_scales),
                  global_scales=(q_global_scale, k_global_scale, v_global_scale))


def nvfp4_k_global_forgotten(q, k, v, *, scale, causal="none", attn_mask=None, q_block_scales, k_block_scales,
                             v_block_scales, q_global_scale, k_global_scale, v_global_scale):
    return _nvfp4(q, k, v, scale=scale, block_scales=(q_block_scales, k_block_scales, v_block_scales),
                  global_scales=(q_global_scale, torch.ones_like(k_global_scale), v_global_scale))
