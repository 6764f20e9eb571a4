"""The field's usual checks, reproduced as anchors to measure flashcheck against.

- flash-attention's test rule: ``max|out - ref32| <= 2 * max|out_pt - ref32|``, where ``ref32`` is
  attention computed in fp32 from the inputs and ``out_pt`` the same attention computed in the input
  dtype (PyTorch ops, no upcast). It has no meaning for fp32 inputs (out_pt == ref32).
- the Triton tutorial's rule: ``allclose(out, ref, atol=1e-2, rtol=0)`` with ``ref`` computed in the
  input dtype (softmax in fp32, P rounded to the input dtype, P @ V in the input dtype).

Both fill rows with no visible key with 0, as flash-attention's own reference does, so that they are not
charged for a convention. The constants here belong to those rules, not to flashcheck's error model.
"""

from __future__ import annotations

import math

import torch

from .case import AttentionCase

__all__ = ["ANCHORS", "flash_attention_rule", "triton_tutorial_rule"]

FA_FACTOR = 2.0  # flash-attention's tests
TUTORIAL_ATOL = 1e-2  # the Triton fused-attention tutorial


def _attention(q, k, v, scale, visible, *, compute_dtype, softmax_dtype):
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1).to(compute_dtype)
    v = v.repeat_interleave(group, dim=1).to(compute_dtype)
    s = (q.to(compute_dtype) @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible, -math.inf).to(softmax_dtype)
    p = torch.softmax(s, dim=-1).to(compute_dtype)
    out = p @ v
    return out.masked_fill(~visible.any(-1, keepdim=True), 0.0)


def _on(device, case: AttentionCase):
    """The case's tensors on the kernel's device: the references run where the kernel ran, as in the
    test suites these rules come from."""
    return (case.q.to(device), case.k.to(device), case.v.to(device), case.visible().to(device))


def flash_attention_rule(out: torch.Tensor, case: AttentionCase) -> bool | None:
    """True when flash-attention's rule accepts ``out``; None for fp32 (the rule is undefined)."""
    if case.torch_dtype == torch.float32:
        return None
    q, k, v, vis = _on(out.device, case)
    ref32 = _attention(q, k, v, case.scale, vis, compute_dtype=torch.float32, softmax_dtype=torch.float32)
    out_pt = _attention(q, k, v, case.scale, vis, compute_dtype=case.torch_dtype,
                        softmax_dtype=case.torch_dtype).float()
    err = (out.detach().float() - ref32).abs().max()
    allowed = FA_FACTOR * (out_pt - ref32).abs().max()
    return bool(err <= allowed)  # NaN in out fails, as it does in their tests


def triton_tutorial_rule(out: torch.Tensor, case: AttentionCase) -> bool:
    """True when the Triton tutorial's ``atol=1e-2`` check accepts ``out``."""
    q, k, v, vis = _on(out.device, case)
    ref = _attention(q, k, v, case.scale, vis, compute_dtype=case.torch_dtype, softmax_dtype=torch.float32)
    return bool(torch.allclose(out.detach().float(), ref.float(), atol=TUTORIAL_ATOL, rtol=0.0))


ANCHORS = {"flash-attention": flash_attention_rule, "triton-tutorial": triton_tutorial_rule}
