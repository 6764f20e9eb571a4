"""A dense case's part of a reproducer (see :mod:`flashcheck.repro.script`): its call through autograd for a backward
case, and its judgement against the float64 attention of :mod:`flashcheck.repro._script`. What comes after the
line ``# ---- form ----`` is copied into the script in place of the template's ``@FORM@`` line."""

import torch

from ._script import CASE, GRADIENTS, attention64, inputs, judge_output, report, tensor

# ---- form ----


def judge_forward(result, x, kw, device):
    exp_out, exp_lse, empty = attention64(x["q"], x["k"], x["v"], x["attn_mask"], kw)
    return judge_output(result, (exp_out, empty), (exp_lse, empty), device)


def run_backward(call, x, kw, device):
    """The kernel's dq, dk, dv through autograd for the case's dO (the variant's tensors whose gradients flashcheck
    judges, CASE["grad_keywords"], require grad too, as flashcheck gives them)."""
    leaves = [x[n].detach().requires_grad_() for n in "qkv"]  # same storage and strides
    extra = [n for n in CASE["grad_keywords"] if n in kw]
    kw = {**kw, **{n: kw[n].detach().requires_grad_() for n in extra}}
    do = tensor(CASE["do"], device)
    with torch.enable_grad():
        result = call(*leaves, x["attn_mask"], kw)
        out = result[0] if isinstance(result, (tuple, list)) else result
        grads = torch.autograd.grad(out, leaves + [kw[n] for n in extra], do, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for g, t in zip(grads[:3], leaves)], do


def judge_backward(grads, x, kw, do):
    exact = [x[n].detach().double().requires_grad_() for n in "qkv"]
    with torch.enable_grad():
        out = attention64(*exact, x["attn_mask"], kw)[0]
        expected = torch.autograd.grad(out, exact, do.double())
    count = 0
    for name, got, want in zip(GRADIENTS, grads, expected):
        if tuple(got.shape) != tuple(want.shape):
            print(f"{name}: the kernel's gradient has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
            count += 1
        else:
            count += report(name, got, want, tensor(CASE["budgets"][name], want.device), overflow_ok=True)
    return count


def run_dense(call, x, kw, device):
    """The kernel's output; for a backward case its (dq, dk, dv) and dO."""
    if CASE["backward"]:
        return run_backward(call, x, kw, device)
    return call(x["q"], x["k"], x["v"], x["attn_mask"], kw)


def judge_dense(result, x, kw, device):
    if CASE["backward"]:
        grads, do = result
        return judge_backward(grads, x, kw, do)
    return judge_forward(result, x, kw, device)


INPUTS, RUN, JUDGE = inputs, run_dense, judge_dense
