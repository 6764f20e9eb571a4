"""FlexAttention compiled on the CPU: after a recompile for dynamic sizes, Inductor's C++ for the flex template does
not compile ("'cur_qSplitSize8' was not declared in this scope").

torch.compile(flex_attention), with its default automatic dynamic shapes, is called twice with a score_mod that adds
a captured bias tensor: fp32, (B, H, Nq, Nk, D, Dv) = (1, 6, 127, 240, 178, 131), then fp16, (2, 8, 39, 15, 149, 28).
The second call recompiles for dynamic sizes and its C++ does not compile. Control: the same two calls compiled
with dynamic=False both run.

Exit status: 1 reproduced (the C++ error, and the control runs), 0 not reproduced, 2 cannot run here (no C++
compiler, no FlexAttention, or the control fails too). Needs torch only. Found with torch 2.13 on the CPU.
"""

from __future__ import annotations

import shutil
import sys
import traceback

import torch

SIGNATURE = "was not declared in this scope"
PROBLEMS = ((1, 6, 127, 240, 178, 131, torch.float32), (2, 8, 39, 15, 149, 28, torch.float16))


def call(compiled, fa, b, h, n_q, n_k, d, dv, dtype, g):
    """``compiled`` on random inputs of these sizes with a score_mod adding a (B, H, Nq, Nk) bias."""
    q, k = (torch.randn(b, h, n, d, generator=g).to(dtype) for n in (n_q, n_k))
    v = torch.randn(b, h, n_k, dv, generator=g).to(dtype)
    bias = torch.randn(1, 1, 1, n_k, generator=g).to(dtype).expand(b, h, n_q, n_k)

    def score_mod(score, b_, h_, q_idx, kv_idx):
        return score + bias[b_, h_, q_idx, kv_idx]

    with torch.no_grad():
        return compiled(q, key=k, value=v, score_mod=score_mod, scale=0.08)


def first_error(fa, **compile_options):
    """The exception of the first call of PROBLEMS that raises under a fresh torch.compile, or None."""
    torch._dynamo.reset()
    compiled = torch.compile(fa.flex_attention, **compile_options)
    g = torch.Generator().manual_seed(0)
    for problem in PROBLEMS:
        try:
            call(compiled, fa, *problem, g)
        except Exception as exc:
            print(f"  {problem}: raised {type(exc).__name__}")
            return exc
        print(f"  {problem}: ran")
    return None


def main() -> int:
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:
        print(f"cannot run: torch {torch.__version__} has no FlexAttention", file=sys.stderr)
        return 2
    if not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        print("cannot run: torch.compile on the CPU needs a C++ compiler", file=sys.stderr)
        return 2
    print(f"torch {torch.__version__}, CPU")
    print("torch.compile(flex_attention), automatic dynamic shapes:")
    dynamic = first_error(fa)
    print("control, torch.compile(flex_attention, dynamic=False):")
    static = first_error(fa, dynamic=False)
    if static is not None:
        traceback.print_exception(static)
        print("cannot run: the control raises too (above)", file=sys.stderr)
        return 2
    if dynamic is None:
        print("not reproduced: both calls run with automatic dynamic shapes")
        return 0
    text = "".join(traceback.format_exception(dynamic))
    if SIGNATURE in text:
        print("\n".join(line.strip() for line in text.splitlines() if SIGNATURE in line)[:2000])
        print("REPRODUCED: the C++ Inductor generates for the dynamic recompile does not compile")
        return 1
    print(text[-3000:])
    print("not reproduced: the dynamic compile raised something else (above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
