"""FlexAttention on an H200: fp32 with head dim 178 compiles and runs with static shapes, but compiled with dynamic
shapes it finds no Triton config of the flex template that fits shared memory ("No valid triton configs ...
out of resource: Required: 245760 Hardware limit: 232448") and raises, where a smaller tile would fit.

The case: fp32, B = 2, H = 6, Nq = 17, Nk = 97, D = 178, Dv = 55, scale 4.797, a block mask of causal (top left)
and a per-batch key padding mask (a captured boolean tensor). Three compiles, each fresh (torch._dynamo.reset()):
- control: torch.compile(flex_attention, dynamic=False), the case alone;
- automatic dynamic shapes (torch.compile's default): the same call with one key fewer, then the case, which
  recompiles with Nk dynamic;
- torch.compile(flex_attention, dynamic=True), the case alone.
Each output that comes back is compared with float64 attention.

Exit status: 1 reproduced (a dynamic compile raises the shared-memory error while the control runs and is right),
0 not reproduced, 2 cannot run here (no CUDA GPU, no FlexAttention or Triton, or the control fails).
Needs torch and triton only. Found with torch 2.11 and Triton 3.6 on an H200 (232,448 bytes of shared memory a block).
"""

from __future__ import annotations

import importlib
import sys
import traceback

import torch

B, H, NQ, NK, D, DV, SCALE = 2, 6, 17, 97, 178, 55, 4.797002809573513
SIGNATURES = ("No valid triton configs", "out of resource")
TOLERANCE = 5e-2  # a sanity check only (the defect is the raise): far above fp32 attention's error here


def inputs(n_k: int, device):
    """Random fp32 q, k, v and a key padding mask hiding the first keys of batch 1."""
    g = torch.Generator().manual_seed(n_k)
    q = torch.randn(B, H, NQ, D, generator=g).to(device)
    k = torch.randn(B, H, n_k, D, generator=g).to(device)
    v = torch.randn(B, H, n_k, DV, generator=g).to(device)
    keep = torch.ones(B, n_k, dtype=torch.bool)
    keep[1, : n_k // 3] = False
    return q, k, v, keep.to(device)


def reference(q, k, v, visible) -> torch.Tensor:
    s = (q.double() @ k.double().transpose(-1, -2)) * SCALE
    s = s.masked_fill(~visible, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key: 0
    return p @ v.double()


def call(compiled, fa, n_k: int, device):
    """``compiled`` on the case with ``n_k`` keys: the worst |out - exact| (an exception propagates)."""
    q, k, v, keep = inputs(n_k, device)

    def mask_mod(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx) & keep[b, kv_idx]

    block_mask = fa.create_block_mask(mask_mod, B, 1, NQ, n_k, device=device)
    out = compiled(q, k, v, block_mask=block_mask, scale=SCALE)
    torch.cuda.synchronize()
    rows, cols = torch.arange(NQ, device=device), torch.arange(n_k, device=device)
    visible = (cols[None, :] <= rows[:, None])[None, None] & keep[:, None, None, :]
    return float((out.double() - reference(q, k, v, visible)).abs().max())


def attempt(fa, label: str, sizes, device, **compile_options):
    """Fresh compile, the calls of ``sizes`` in turn: None when every call ran and was right, else the exception."""
    torch._dynamo.reset()
    compiled = torch.compile(fa.flex_attention, **compile_options)
    for n_k in sizes:
        try:
            error = call(compiled, fa, n_k, device)
        except Exception as exc:
            print(f"{label}: Nk = {n_k} raised {type(exc).__name__}")
            return exc
        print(f"{label}: Nk = {n_k} ran, max |out - exact| = {error:.3g}")
        if not error <= TOLERANCE:
            return AssertionError(f"wrong output at Nk = {n_k}: {error:.3g}")
    return None


def cannot_run() -> str | None:
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    try:
        for name in ("triton", "torch.nn.attention.flex_attention"):
            importlib.import_module(name)
    except ImportError as exc:
        return f"FlexAttention or Triton cannot be imported ({exc})"
    return None


def main() -> int:
    why = cannot_run()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return 2
    import torch.nn.attention.flex_attention as fa
    import triton
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    print(f"torch {torch.__version__}, triton {triton.__version__}, {props.name}, "
          f"{getattr(props, 'shared_memory_per_block_optin', '?')} bytes of shared memory a block")
    print(f"fp32 B={B} H={H} Nq={NQ} Nk={NK} D={D} Dv={DV} scale={SCALE:.4g}, causal + key padding block mask")
    control = attempt(fa, "control, dynamic=False", (NK,), device, dynamic=False)
    if control is not None:
        traceback.print_exception(control)
        print("cannot run: the control fails too (above)", file=sys.stderr)
        return 2
    failures = [attempt(fa, "automatic dynamic shapes", (NK - 1, NK), device),
                attempt(fa, "dynamic=True", (NK,), device, dynamic=True)]
    for exc in filter(None, failures):
        text = "".join(traceback.format_exception(exc))
        if any(s in text for s in SIGNATURES):
            print("\n".join(line.strip() for line in text.splitlines() if any(s in line for s in SIGNATURES))[:2000])
            print("REPRODUCED: the dynamic-shape compile finds no flex template config that fits shared memory")
            return 1
        print(text[-3000:])
    print("not reproduced: no dynamic compile raised the shared-memory error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
