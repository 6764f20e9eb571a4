"""PyTorch's jagged nested tensors through scaled_dot_product_attention on CUDA: NaN for a negative scale, and a crash
("setStorage: ... out of bounds") when every sequence has one query and one sequence has no key.

1. One sequence, one query, one key, D = 16, fp16, scale -0.25: NaN; scale +0.25 (control): finite and right.
2. Two sequences of one query, with one key and none: raises; both with one key (control): runs.

Exit status: 1 reproduced (either), 0 not reproduced, 2 cannot run here (no CUDA device for --device cuda).
Needs torch only. Found with torch 2.11 on an H200 (the crash also on the CPU, torch 2.13).
"""

from __future__ import annotations

import argparse
import sys
import traceback

import torch

F = torch.nn.functional


def jagged(packed, lengths, device):
    """(total, H, D) rows packed sequence after sequence as a jagged nested tensor (B, H, j, D)."""
    offsets = torch.tensor([0, *lengths], device=device).cumsum(0)
    return torch.nested.nested_tensor_from_jagged(packed, offsets).transpose(1, 2)


def attention(q_lens, k_lens, scale, device):
    """SDPA on random fp16 jagged inputs with these lengths (H = 1, D = 16); the packed output rows."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(sum(n), 1, 16, generator=g).half().to(device) for n in (q_lens, k_lens, k_lens))
    out = F.scaled_dot_product_attention(jagged(q, q_lens, device), jagged(k, k_lens, device),
                                         jagged(v, k_lens, device), scale=scale)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out.transpose(1, 2).values(), v


def negative_scale(device) -> bool:
    """NaN for scale -0.25 where +0.25 is finite: with one key, the output is that key's V row."""
    out, v = attention([1], [1], -0.25, device)
    control, _ = attention([1], [1], 0.25, device)
    print(f"1. scale -0.25: {out.flatten()[:4].tolist()} ...; +0.25: {control.flatten()[:4].tolist()} ...; "
          f"V: {v.flatten()[:4].tolist()} ...")
    if not torch.equal(control, v):
        print("   (the control is not V: see above)")
    return bool(out.isnan().any()) and bool(control.isfinite().all())


def empty_sequence(device) -> bool:
    """A raise with k_lens [1, 0] where k_lens [1, 1] runs."""
    attention([1, 1], [1, 1], 0.25, device)
    try:
        attention([1, 1], [1, 0], 0.25, device)
    except Exception:
        print("2. q_lens [1, 1], k_lens [1, 0] raised (k_lens [1, 1] runs):")
        print("   " + traceback.format_exc().strip().splitlines()[-1][:500])
        return True
    print("2. q_lens [1, 1], k_lens [1, 0] runs")
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    device = torch.device(parser.parse_args().device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cannot run: torch sees no CUDA device (pass --device cpu for the crash alone)", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}")
    found = [name for name, check in (("NaN for a negative scale", negative_scale),
                                      ("a crash on a sequence without keys", empty_sequence)) if check(device)]
    if found:
        print(f"REPRODUCED: {'; '.join(found)}")
        return 1
    print("not reproduced")
    return 0


if __name__ == "__main__":
    sys.exit(main())
