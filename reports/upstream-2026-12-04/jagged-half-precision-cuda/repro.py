"""PyTorch's jagged nested tensors through scaled_dot_product_attention compute fp16 attention in fp16: where the
flash kernel cannot take the call (any head dim on the CPU; on CUDA a head dim that is not a multiple of 8), the
math composite runs in the inputs' dtype (q and k each times sqrt(scale), then q k^T, the softmax and P V, each
rounded to fp16), without the fp32 upcast of the dense math backend.

Two sequences of one query and two keys, D = 3, fp16, logits near 570 (fp16's spacing there is 0.5). The
same numbers as dense (B, H, N, D) tensors through SDPA's math backend are the control.

Exit status: 1 reproduced (the jagged output's error is over 16 times the larger of the dense math backend's error
and half an fp16 ulp of the output), 0 not reproduced, 2 cannot run here (no CUDA device for --device cuda).
Needs torch only. Found with torch 2.13 on the CPU and torch 2.11 on an H200.
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

F = torch.nn.functional
FACTOR = 16


def inputs(device):
    """q (B, H, 1, D) of 30s, keys near 11 (logits near 570 and 0.05 apart), fp16."""
    g = torch.Generator().manual_seed(0)
    q = torch.full((2, 1, 1, 3), 30.0)
    k = 11 + 0.03 * torch.randn(2, 1, 2, 3, generator=g)
    v = torch.randn(2, 1, 2, 3, generator=g)
    return tuple(t.half().to(device) for t in (q, k, v)), 3 ** -0.5


def jagged_sdpa(q, k, v, scale):
    """Dense (B, H, N, D) tensors as jagged nested tensors of B sequences, through SDPA; the dense result."""
    b, h, n_q, _ = q.shape
    n_k = k.shape[2]
    offsets = [torch.arange(0, b * n + 1, n, device=q.device) for n in (n_q, n_k, n_k)]
    nested = [torch.nested.nested_tensor_from_jagged(t.transpose(1, 2).reshape(-1, h, t.shape[3]), o).transpose(1, 2)
              for t, o in zip((q, k, v), offsets)]
    out = F.scaled_dot_product_attention(*nested, scale=scale)
    return out.transpose(1, 2).values().reshape(b, n_q, h, -1).transpose(1, 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cannot run: torch sees no CUDA device", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}")
    (q, k, v), scale = inputs(device)
    exact = torch.softmax(q.double() @ k.double().transpose(-1, -2) * scale, dim=-1) @ v.double()
    got = jagged_sdpa(q, k, v, scale).double()
    with sdpa_kernel(SDPBackend.MATH):
        dense = F.scaled_dot_product_attention(q, k, v, scale=scale).double()
    err, control = float((got - exact).abs().max()), float((dense - exact).abs().max())
    half_ulp = float(torch.finfo(torch.float16).eps) * float(exact.abs().max()) / 2
    print(f"exact  {exact.flatten().tolist()}\njagged {got.flatten().tolist()}\ndense  {dense.flatten().tolist()}")
    print(f"max |error|: jagged {err:.3g}, dense math backend {control:.3g}, half an fp16 ulp {half_ulp:.3g}")
    if err > FACTOR * max(control, half_ulp):
        print(f"REPRODUCED: the jagged output is {err / max(control, half_ulp):.0f} times farther from exact attention")
        return 1
    print("not reproduced: the jagged output is as close as the dense math backend's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
