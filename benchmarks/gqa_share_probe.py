"""Probe of the GQA dK/dV defect class (``group_share_past_range``): a kernel that rounds each query head's share
of dK and dV to the inputs' dtype before it sums the group gives inf or NaN where the summed gradient is small.

For each SDPA backend and case it prints the kernel's dK and dV against two CPU models of that order of
operations, from the exact float64 shares (the gradients of the same attention with K and V repeated over the
query heads):

- ``shares``: each head's share rounded to the dtype, then the group summed in fp32 and rounded once (an fp16
  ``dk_expanded`` buffer summed over the group afterwards);
- ``running``: the running sum over the group's heads rounded to the dtype after each head.

A model "matches" when every element is bit-identical to the kernel's, NaN for NaN. Cases: the hand-built one of
tests/_cases.py, its control (each share inside the range), and saved backward cases given on the command line
(a campaign's corpus). Usage: python benchmarks/gqa_share_probe.py [cuda|cpu] [CASE.json ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests._cases, from the repository root

from flashcheck import AttentionCase, check_backward  # noqa: E402
from flashcheck.judge.backward import upstream_gradient  # noqa: E402
from flashcheck.kernels.registry import resolve_kernel  # noqa: E402
from flashcheck.numerics.gradients import group_share_max, reference_gradients  # noqa: E402
from tests._cases import cancelling_group_case  # noqa: E402

KERNELS = {"cuda": ("torch:math", "torch:flash", "torch:efficient", "torch:cudnn"), "cpu": ("torch:math", "torch:flash")}


def exact_shares(case: AttentionCase, do: torch.Tensor) -> dict:
    """{"dk", "dv"}: (B, Hkv, G, Nk, .) float64 shares of each query head."""
    g = case.shapes.group
    grads = reference_gradients(case.q, case.k.repeat_interleave(g, 1), case.v.repeat_interleave(g, 1), do.cpu(),
                                scale=case.scale,
                                causal=case.causal, attn_mask=case.attn_mask, variant=case.variant)
    return {n: t.cpu().reshape(t.shape[0], -1, g, *t.shape[2:]) for n, t in (("dk", grads.dk), ("dv", grads.dv))}


def models(shares: torch.Tensor, dtype) -> dict:
    rounded = shares.to(dtype).float()
    running = torch.zeros_like(rounded[:, :, 0])
    for h in range(shares.shape[2]):
        running = (running + shares[:, :, h].float()).to(dtype).float()
    return {"shares": rounded.sum(2).to(dtype), "running": running.to(dtype)}


def kernel_grads(name: str, case: AttentionCase, do: torch.Tensor, device: str) -> dict | str:
    kern = resolve_kernel(name, device=device)
    leaves = [t.to(device).requires_grad_() for t in (case.q, case.k, case.v)]
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    try:
        out = kern(*leaves, scale=case.scale, causal=case.causal, attn_mask=mask, **case.variant.kwargs(device))
        out = out[0] if isinstance(out, tuple) else out
        _, dk, dv = torch.autograd.grad(out, leaves, do.to(device))
    except Exception as exc:  # noqa: BLE001 - a refused or crashing backend is a line of the table
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return {"dk": dk.detach().cpu(), "dv": dv.detach().cpu()}


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def probe(label: str, case: AttentionCase, do: torch.Tensor, device: str) -> None:
    shares = exact_shares(case, do)
    biggest = group_share_max(case.q, case.k, case.v, do.cpu(),
                              scale=case.scale, causal=case.causal, attn_mask=case.attn_mask, variant=case.variant)
    print(f"{label}: {case.describe()[:90]}; largest exact share {biggest:.6g}")
    for name in KERNELS[device]:
        got = kernel_grads(name, case, do, device)
        if isinstance(got, str):
            print(f"  {name:16} {got}")
            continue
        fits = {m: all(same_bits(got[n], models(shares[n], case.torch_dtype)[m]) for n in ("dk", "dv"))
                for m in ("shares", "running")}
        verdict = check_backward(name, case, do=do.to(device), device=device)
        excluded = check_backward(name, case, do=do.to(device), device=device, exclusions=True).skipped
        nonfinite = int((~got["dk"].isfinite()).sum()) + int((~got["dv"].isfinite()).sum())
        print(f"  {name:16} {verdict.status:10} non-finite dK/dV elements {nonfinite:3}  dK[..., 0] "
              f"{got['dk'][..., 0].flatten().tolist()}  model shares {fits['shares']}, running {fits['running']}; "
              f"with the spec's exclusions: {excluded or 'judged'}")


def main(device: str, paths: list[str]) -> None:
    for upstream, label in ((6.25, "hand-built"), (1.0, "control (shares inside the range)")):
        case, do = cancelling_group_case(upstream)
        probe(label, case, do, device)
    for path in paths:
        case = AttentionCase.load(path)
        if case.shapes.group > 1:
            probe(Path(path).name, case, upstream_gradient(case, device).cpu(), device)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cuda", sys.argv[2:])
