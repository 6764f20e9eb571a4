"""The field's usual checks, reproduced as anchors to measure flashcheck against.

- flash-attention's test rule: ``max|out - ref32| <= 2 * max|out_pt - ref32|``, where ``ref32`` is
  attention computed in fp32 from the inputs and ``out_pt`` the same attention computed in the input
  dtype (PyTorch ops, no upcast). It has no meaning for fp32 inputs (out_pt == ref32).
- the Triton tutorial's rule: ``allclose(out, ref, atol=1e-2, rtol=0)`` with ``ref`` computed in the
  input dtype (softmax in fp32, P rounded to the input dtype, P @ V in the input dtype).

Their backward rules (:data:`BACKWARD_ANCHORS`) judge dQ, dK and dV for one upstream gradient dO, each
against references differentiated by autograd through the same attention:

- flash-attention: ``max|dX - dX_ref32| <= 2 * max|dX_pt - dX_ref32|`` for each gradient, as above.
- PyTorch's SDPA tests (``test_transformers.py``, fused kernels against the math reference):
  ``ref`` in a higher precision (fp32, or fp64 for fp32 inputs), ``lp_ref`` in the input dtype;
  ``atol = f * max(max|ref - lp_ref|, atol_0)``, ``rtol = f * max(max|ref - lp_ref| / |ref|, rtol_0)``,
  with fudge factors f = 160 (dQ), 25 (dK), 8 (dV), then ``|dX - ref| <= atol + rtol |ref|``.
- the Triton tutorial: ``allclose(dX, ref, atol=1e-2, rtol=0)``, ``ref`` in the input dtype with
  the softmax in fp32.

All fill rows with no visible key with 0 (zero gradients), as flash-attention's own reference does, so
that they are not charged for a convention. Their references take the case's mask, causal alignment and variant
(its visible keys, cap, bias and sink) in their own dtypes, as flash-attention's reference does; fp8 inputs, descaled, are not theirs to judge (:func:`anchor_outcomes` says "n/a"). The
constants here belong to those rules, not to flashcheck's error model.
"""

from __future__ import annotations

import math

import torch

from ..features.scores import bias_after_cap, capped_scores
from ..features.variant import Variant
from ..inputs.case import AttentionCase
from ..numerics.blockwise import by_group
from .verdict import ANCHOR_FAIL, ANCHOR_PASS, NOT_APPLICABLE

__all__ = ["ANCHORS", "BACKWARD_ANCHORS", "GradientReferences", "anchor_outcomes", "flash_attention_rule",
           "triton_tutorial_rule"]

FA_FACTOR = 2.0  # flash-attention's tests
TUTORIAL_ATOL = 1e-2  # the Triton fused-attention tutorial
PYTORCH_FUDGE = {"dq": 160.0, "dk": 25.0, "dv": 8.0}  # test_transformers.py, fused vs math gradients
PYTORCH_ATOL = {torch.float16: 1e-3, torch.bfloat16: 1e-3, torch.float32: 1e-5}  # torch.testing's defaults
PYTORCH_RTOL = {torch.float16: 1e-3, torch.bfloat16: 1.6e-2, torch.float32: 1.3e-6}


def _attention(q, k, v, scale, visible, *, compute_dtype, softmax_dtype, variant: Variant | None = None):
    k, v = k.to(compute_dtype), v.to(compute_dtype)
    s = _scores(by_group(q.to(compute_dtype), k.transpose(-1, -2)) * scale, variant or Variant())
    empty = ~visible.any(-1, keepdim=True)  # rows with no visible key: zero output, zero gradients (not NaN)
    s = s.masked_fill(~visible, -math.inf).masked_fill(empty, 0.0).to(softmax_dtype)
    sink = None if variant is None or variant.sink is None else variant.sink.to(s.device, softmax_dtype)
    if sink is not None:  # each head's sink: one more logit in the softmax, with no value
        s = torch.cat((s, sink.view(1, -1, 1, 1).expand(*s.shape[:-1], 1)), dim=-1)
    p = torch.softmax(s, dim=-1)[..., :visible.shape[-1]].masked_fill(empty, 0.0).to(compute_dtype)
    return by_group(p, v)


def _scores(s: torch.Tensor, variant: Variant) -> torch.Tensor:
    """The scaled logits as the variant has them, in their dtype: its bias added before or after its cap
    (``bias_order``), as the field's references add them."""
    n_q, n_k = s.shape[-2:]
    bias = variant.bias(n_q, n_k, torch.arange(n_q), s.device)
    bias = None if bias is None else bias.to(s.dtype)
    late = bias_after_cap(bias is not None, variant.cap, variant.bias_order)
    return capped_scores(s, bias, variant.cap, late, torch.tanh)[1]


def _on(device, case: AttentionCase):
    """The case's tensors on the kernel's device: the references run where the kernel ran, as in the
    test suites these rules come from."""
    return (case.q.to(device), case.k.to(device), case.v.to(device), case.visible().to(device))


def flash_attention_rule(out: torch.Tensor, case: AttentionCase) -> bool | None:
    """True when flash-attention's rule accepts ``out``; None for fp32 (the rule is undefined)."""
    if case.torch_dtype == torch.float32:
        return None
    q, k, v, vis = _on(out.device, case)
    ref32 = _attention(q, k, v, case.scale, vis, compute_dtype=torch.float32, softmax_dtype=torch.float32,
                       variant=case.variant)
    out_pt = _attention(q, k, v, case.scale, vis, compute_dtype=case.torch_dtype, softmax_dtype=case.torch_dtype,
                        variant=case.variant).float()
    err = (out.detach().float() - ref32).abs().max()
    allowed = FA_FACTOR * (out_pt - ref32).abs().max()
    return bool(err <= allowed)  # NaN in out fails, as it does in their tests


def triton_tutorial_rule(out: torch.Tensor, case: AttentionCase) -> bool:
    """True when the Triton tutorial's ``atol=1e-2`` check accepts ``out``."""
    q, k, v, vis = _on(out.device, case)
    ref = _attention(q, k, v, case.scale, vis, compute_dtype=case.torch_dtype, softmax_dtype=torch.float32,
                     variant=case.variant)
    return bool(torch.allclose(out.detach().float(), ref.float(), atol=TUTORIAL_ATOL, rtol=0.0))


ANCHORS = {"flash-attention": flash_attention_rule, "triton-tutorial": triton_tutorial_rule}


class GradientReferences:
    """The reference gradients the backward rules compare with, for one case and dO, each computed once
    (autograd through :func:`_attention` at a compute and softmax dtype) on the kernel's device."""

    def __init__(self, case: AttentionCase, do: torch.Tensor, device):
        self.case, self.do, self.device = case, do, device
        self.dtype = case.torch_dtype
        self._cache: dict = {}

    def get(self, compute_dtype, softmax_dtype) -> tuple:
        key = (compute_dtype, softmax_dtype)
        if key not in self._cache:
            q, k, v, vis = _on(self.device, self.case)
            leaves = [t.to(compute_dtype).requires_grad_() for t in (q, k, v)]
            with torch.enable_grad():
                out = _attention(*leaves, self.case.scale, vis, compute_dtype=compute_dtype,
                                 softmax_dtype=softmax_dtype, variant=self.case.variant)
                grads = torch.autograd.grad(out, leaves, self.do.to(self.device, compute_dtype))
            self._cache[key] = tuple(g.detach().float() if compute_dtype != torch.float64 else g.detach()
                                     for g in grads)
        return self._cache[key]


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.detach().to(b.dtype) - b).abs().max()


def flash_attention_backward_rule(grads, refs: GradientReferences) -> bool | None:
    """flash-attention's 2x rule on each of dQ, dK, dV; None for fp32 inputs."""
    if refs.dtype == torch.float32:
        return None
    ref32 = refs.get(torch.float32, torch.float32)
    pt = refs.get(refs.dtype, refs.dtype)
    return all(bool(_max_abs(g, r) <= FA_FACTOR * _max_abs(p, r)) for g, r, p in zip(grads, ref32, pt))


def _pytorch_tolerances(ref: torch.Tensor, lp_ref: torch.Tensor, dtype, fudge: float) -> tuple[float, float]:
    deviation = (ref - lp_ref.to(ref.dtype)).abs()
    atol = fudge * max(float(deviation.max()), PYTORCH_ATOL[dtype])
    relative = torch.nan_to_num(deviation / ref.abs(), nan=PYTORCH_RTOL[dtype])  # 0/0 -> the default
    rtol = fudge * max(float(relative.max()), PYTORCH_RTOL[dtype])
    return atol, (PYTORCH_RTOL[dtype] if rtol > 1e30 else rtol)  # x/0 = inf: PyTorch falls back too


def pytorch_sdpa_backward_rule(grads, refs: GradientReferences) -> bool:
    """PyTorch's SDPA gradient check with its fudge factors (``assert_close(dX, ref, atol, rtol)``)."""
    high = torch.float64 if refs.dtype == torch.float32 else torch.float32
    ref = refs.get(high, high)
    lp = refs.get(refs.dtype, refs.dtype)
    for name, g, r, low in zip(("dq", "dk", "dv"), grads, ref, lp):
        atol, rtol = _pytorch_tolerances(r, low, refs.dtype, PYTORCH_FUDGE[name])
        g = g.detach().to(r.dtype)
        if not bool(((g - r).abs() <= atol + rtol * r.abs()).all()):  # NaN fails, as in assert_close
            return False
    return True


def triton_tutorial_backward_rule(grads, refs: GradientReferences) -> bool:
    """The Triton tutorial's ``allclose(atol=1e-2, rtol=0)`` on each gradient."""
    ref = refs.get(refs.dtype, torch.float32)
    return all(torch.allclose(g.detach().float(), r.float(), atol=TUTORIAL_ATOL, rtol=0.0) for g, r in zip(grads, ref))


BACKWARD_ANCHORS = {"flash-attention": flash_attention_backward_rule, "pytorch-sdpa": pytorch_sdpa_backward_rule,
                    "triton-tutorial": triton_tutorial_backward_rule}


_WORDS = {True: ANCHOR_PASS, False: ANCHOR_FAIL, None: NOT_APPLICABLE}  # a rule's answer: accepted, or undefined


def anchor_outcomes(case, output, *, device, do=None) -> dict[str, str]:
    """What each of the field's rules says of a kernel's ``output`` on ``case``: its forward ``(out, lse)``,
    or, given the upstream gradient ``do``, its ``(dq, dk, dv)``. "fail" where the kernel gave no output of
    the right shape (their tests fail then too), "n/a" where a rule is undefined (fp32 for flash-attention's),
    on a case with no element, and on fp8 inputs (descaled: their references compute another function)."""
    rules = ANCHORS if do is None else BACKWARD_ANCHORS
    quantized = isinstance(case, AttentionCase) and case.variant.quantized
    if not isinstance(case, AttentionCase) or quantized or not (case.q.numel() and case.k.numel()):
        return dict.fromkeys(rules, NOT_APPLICABLE)
    got = _judged_output(case, output, backward=do is not None)
    if got is None:
        return dict.fromkeys(rules, ANCHOR_FAIL)
    if do is None:
        return {name: _WORDS[rule(got, case)] for name, rule in ANCHORS.items()}
    refs = GradientReferences(case, do, device)
    return {name: _WORDS[rule(got, refs)] for name, rule in BACKWARD_ANCHORS.items()}


def _judged_output(case: AttentionCase, output, *, backward: bool):
    """``out``, or ``(dq, dk, dv)``, from a kernel's output; None when it gave none of the right shape."""
    wanted = [case.q.shape, case.k.shape, case.v.shape] if backward else [(*case.q.shape[:3], case.v.shape[3])]
    got = list(output or ())[:len(wanted)]
    if len(got) < len(wanted) or any(not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(w)
                                     for g, w in zip(got, wanted)):
        return None
    return tuple(got) if backward else got[0]
