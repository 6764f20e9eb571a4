"""fla-core's attn_decoding_one_step on the H200 campaign's shrunk cases, beside the CPU model of its arithmetic
(tests/_fla_decoding.py): how far its output is from the model with half-precision scores, from the same order
with fp32 scores, and from float64 attention, in units of the output dtype's ulp at 1 (max and share of equal
elements). Usage (repository root, on a CUDA GPU with fla-core):
python3 reports/serving-2026-12-03/fla_decoding_probe.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "src")]

from flashcheck.inputs.casefile import load_case  # noqa: E402
from flashcheck.kernels.registry import resolve_kernel  # noqa: E402
from tests._fla_decoding import model_kernel  # noqa: E402

CASES = sorted((Path(__file__).parent / "h200" / "fla-decoding-cases").glob("*.json"))


def _run(kernel, case, device):
    inputs = case.physical(device)
    return kernel.fn(*inputs.tensors, **inputs.kwargs, scale=case.scale, causal=case.causal).cpu()


def main() -> None:
    fla = resolve_kernel("fla:attn_decoding", device="cuda")
    print(f"{'case':<12} {'dtype':<5} {'versus':<18} {'max ulps':>9} {'equal':>7}")
    for path in CASES:
        case = load_case(path)
        got = _run(fla, case, "cuda").double()
        ulp = torch.finfo(case.base.torch_dtype).eps
        for name, dtype in (("half scores", None), ("fp32 scores", torch.float32), ("float64", torch.float64)):
            want = _run(model_kernel(dtype), case, "cpu").double()
            print(f"{path.stem[-10:]:<12} {case.dtype:<5} {name:<18} {(got - want).abs().max().item() / ulp:>9.2f} "
                  f"{(got == want).double().mean().item():>7.1%}")


if __name__ == "__main__":
    main()
