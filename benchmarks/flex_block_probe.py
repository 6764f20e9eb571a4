"""Controls for a FlexAttention block-sparse finding, written against torch alone (no flashcheck code in the calls):
compiled flex_attention with a BlockMask of q_block x kv_block blocks, each dtype and head dim of the finding's
shapes, with FlexAttention's own kernel choice and with kernel_options that set its tiles to the blocks. A row per
call: whether it compiled and ran, and the exception's class and first line if not.

Usage (repository root, a GPU): python3 benchmarks/flex_block_probe.py [Q_LEN KV_LEN]
  or: python3 benchmarks/flex_block_probe.py lengths [Q_LEN,...]: fp16, D 64, blocks of 64 x 64 with FlexAttention's
  own tiles, at each query length (KV_LEN 246): which lengths fail to compile.
"""

from __future__ import annotations

import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
HEAD_DIMS = ((16, 16), (64, 64), (204, 68))
BLOCKS = ((64, 64), (128, 128))


def _causal(b, h, q_idx, kv_idx):
    return kv_idx <= q_idx


def _call(compiled, q_len: int, kv_len: int, d: int, dv: int, dtype, block, tiles: bool) -> str:
    q = torch.randn(1, 1, q_len, d, device="cuda", dtype=dtype)
    k = torch.randn(1, 1, kv_len, d, device="cuda", dtype=dtype)
    v = torch.randn(1, 1, kv_len, dv, device="cuda", dtype=dtype)
    mask = create_block_mask(_causal, 1, 1, q_len, kv_len, device="cuda", BLOCK_SIZE=block)
    options = {"BLOCK_M": block[0], "BLOCK_N": block[1]} if tiles else None
    try:
        out = compiled(q, k, v, block_mask=mask, kernel_options=options)
        torch.cuda.synchronize()
        return "ran" if torch.isfinite(out).all() else "ran, non-finite out"
    except Exception as exc:  # the finding is the exception: its class and first line
        return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:110]}"


def main() -> None:
    import torch._dynamo

    # every row is a recompile: past dynamo's limit (8) flex would run its eager path instead, another kernel
    torch._dynamo.config.recompile_limit = 1 << 16
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    compiled = torch.compile(flex_attention)
    if sys.argv[1:2] == ["lengths"]:
        _lengths(compiled, [int(n) for n in (sys.argv[2] if len(sys.argv) > 2 else "64,65,127,128,129,200").split(",")])
        return
    q_len, kv_len = (int(a) for a in sys.argv[1:3]) if len(sys.argv) > 2 else (65, 246)
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: causal, Q_LEN {q_len}, KV_LEN {kv_len}")
    print(f"{'dtype':<5} {'D/Dv':<8} {'blocks':<8} {'kernel tiles':<13} outcome")
    for name, dtype in DTYPES.items():
        for d, dv in HEAD_DIMS:
            for block in BLOCKS:
                for tiles in (False, True):
                    outcome = _call(compiled, q_len, kv_len, d, dv, dtype, block, tiles)
                    print(f"{name:<5} {f'{d}/{dv}':<8} {f'{block[0]}x{block[1]}':<8} "
                          f"{'= blocks' if tiles else 'flex picks':<13} {outcome}", flush=True)


def _lengths(compiled, q_lens: list[int]) -> None:
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}: causal, fp16, D 64, blocks 64x64, "
          "FlexAttention's tiles, KV_LEN 246")
    for q_len in q_lens:
        print(f"Q_LEN {q_len:<5} {_call(compiled, q_len, 246, 64, 64, torch.float16, (64, 64), False)}", flush=True)


if __name__ == "__main__":
    main()
