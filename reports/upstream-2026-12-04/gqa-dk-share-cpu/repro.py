"""PyTorch SDPA backward with GQA (enable_gqa=True): each query head's share of dK is rounded to fp16 before the
group's shares are summed, so shares past 65,504 that cancel give NaN (CUDA flash, memory-efficient, cuDNN) or
+-inf (CPU flash) where the exact dK is 0.

fp16, 2 query heads on 1 K/V head, 3 queries, 2 keys, D = 16, scale 16, Q = 1, K = 0, V = +-50 and dO = +-6.25 of
opposite signs on the two heads: every dS is 2,500 and scale x dS 40,000 (inside fp16's range), each head's dK share
is +-120,000 and the exact dK is 0. The control, dO = +-1, keeps every share at 19,200. The memory-efficient backend
takes no enable_gqa: K and V are repeated over the query heads, as a caller has to.

Exit status: 1 reproduced (a non-finite dK where the exact one is finite, and the control right), 0 not reproduced,
2 cannot run here (no CUDA device for --device cuda). Needs torch only. Found with torch 2.11 on an H200 (flash,
efficient, cuDNN) and torch 2.13 on the CPU (flash).
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {"cuda": ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"),
            "cpu": ("FLASH_ATTENTION", "MATH")}


def inputs(upstream: float, device):
    q = torch.ones(1, 2, 3, 16, dtype=torch.float16, device=device)
    k = torch.zeros(1, 1, 2, 16, dtype=torch.float16, device=device)
    v = torch.tensor([50.0, -50.0], dtype=torch.float16, device=device).reshape(1, 1, 2, 1).expand(1, 1, 2, 16)
    do = torch.full((1, 2, 3, 16), upstream, dtype=torch.float16, device=device)
    do[:, 1] = -upstream
    return q, k, v.contiguous(), do


def dk(backend: str, upstream: float, device):
    """dK of SDPA under ``backend`` (K and V repeated for the memory-efficient one), and the exact float64 dK."""
    q, k, v, do = inputs(upstream, device)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    kq, vq, kw = leaves[1], leaves[2], {"enable_gqa": True}
    if backend == "EFFICIENT_ATTENTION":
        kq, vq, kw = leaves[1].repeat_interleave(2, 1), leaves[2].repeat_interleave(2, 1), {}
    with sdpa_kernel(getattr(SDPBackend, backend)):
        out = torch.nn.functional.scaled_dot_product_attention(leaves[0], kq, vq, scale=16.0, **kw)
    got = torch.autograd.grad(out, leaves, do)[1]
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = exact[0] @ exact[1].repeat_interleave(2, 1).transpose(-1, -2) * 16.0
    ref = torch.softmax(s, -1) @ exact[2].repeat_interleave(2, 1)
    return got, torch.autograd.grad(ref, exact, do.double())[1]


def broken(backend: str, upstream: float, device) -> bool:
    got, exact = dk(backend, upstream, device)
    bad = ~got.isfinite() & exact.isfinite()
    print(f"  {backend:20} dO = +-{upstream}: dK[0, 0, :, 0] = {got[0, 0, :, 0].tolist()}, exact "
          f"{exact[0, 0, :, 0].tolist()}: {int(bad.sum())} of {bad.numel()} non-finite where the exact dK is finite")
    return bool(bad.any())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cannot run: torch sees no CUDA device (pass --device cpu for the CPU flash kernel)", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}")
    found = []
    for backend in BACKENDS[device.type]:
        try:
            if broken(backend, 6.25, device) and not broken(backend, 1.0, device):
                found.append(backend)
        except RuntimeError as exc:  # a backend this machine does not have
            print(f"  {backend:20} cannot run: {str(exc).splitlines()[0][:120]}")
    if found:
        print(f"REPRODUCED: {', '.join(found)}: non-finite dK where the exact dK is 0 (each head's share past 65,504)")
        return 1
    print("not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
