"""SGLang's MLA decode at one query head against several, on the same rows, written against torch and sglang alone
(no flashcheck code in the calls): with Hq = 1 SGLang takes its ungrouped stage-1 kernel, with Hq > 1 its grouped
one. Each query head of the Hq > 1 call is a copy of the one head, so both calls have the same exact lse and out.

Rows: fp16 with q.k products past fp16's 65,504 in some columns (a logit fp32 holds), and bf16 and fp16 with normal
rows of 1 to 4,096 keys; each row's lse and out against float64. A row per (dtype, rows, Hq).

Usage (repository root, a GPU, sglang installed): python3 benchmarks/sglang_mla_heads_probe.py
"""

from __future__ import annotations

import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd

RANK, ROPE = 512, 64
D = RANK + ROPE
SPLITS = 8
SCALE = 192 ** -0.5


def _decode(q, pool, n_keys: int):
    """SGLang's decode of one request over slots 1..n_keys of pool (slot 0 its padding): (out, lse)."""
    heads = q.shape[0]
    out = torch.empty(1, heads, RANK, dtype=q.dtype, device="cuda")
    logits = torch.empty(1, heads, SPLITS, RANK, dtype=torch.float32, device="cuda")
    lse = torch.full((1, heads, SPLITS), -torch.inf, dtype=torch.float32, device="cuda")
    indptr = torch.tensor([0, n_keys], dtype=torch.int32, device="cuda")
    indices = torch.arange(1, n_keys + 1, dtype=torch.int64, device="cuda")
    splits = torch.full((1,), SPLITS, dtype=torch.int32, device="cuda")
    decode_attention_fwd(q[None], pool, pool[..., :RANK], out, indptr, indices, logits, lse, splits, SPLITS, SCALE,
                         1.0, 1.0, logit_cap=0.0, has_mla=True, page_size=1)
    return out[0], torch.logsumexp(lse[0], -1)


def _exact(q, keys):
    logits = (q[0].double() @ keys.double().T) * SCALE
    return torch.softmax(logits, -1) @ keys[:, :RANK].double(), torch.logsumexp(logits, -1)


def _rows(kind: str, dtype, n_keys: int):
    gen = torch.Generator(device="cuda").manual_seed(n_keys)
    q = torch.randn(1, D, device="cuda", generator=gen)
    keys = torch.randn(n_keys, D, device="cuda", generator=gen)
    if kind == "huge products":  # 16 columns whose product is 90,000 > 65,504; the logit is about 1e5, fp32's
        q[:, :16], keys[:, :16] = 300.0, 300.0
    return q.to(dtype), keys.to(dtype)


def main() -> None:
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    print(f"{'dtype':<5} {'rows':<14} {'keys':>5} {'Hq':>3} {'lse err':>10} {'out err':>10} {'finite':>6}")
    for dtype, kind, n_keys in ((torch.float16, "huge products", 1), (torch.float16, "huge products", 64),
                                (torch.float16, "normal", 1), (torch.float16, "normal", 4096),
                                (torch.bfloat16, "normal", 1), (torch.bfloat16, "normal", 4096)):
        q, keys = _rows(kind, dtype, n_keys)
        pool = torch.cat([keys.new_zeros(1, D), keys])[:, None, :]
        out_x, lse_x = _exact(q, keys)
        for heads in (1, 2, 16):
            out, lse = _decode(q.expand(heads, D).contiguous(), pool, n_keys)
            finite = bool(torch.isfinite(out).all() and torch.isfinite(lse).all())
            lse_err = (lse.double() - lse_x).abs().max().item()
            out_err = (out.double() - out_x).abs().max().item()
            print(f"{str(dtype)[6:]:<5} {kind:<14} {n_keys:>5} {heads:>3} {lse_err:>10.3g} {out_err:>10.3g} "
                  f"{str(finite):>6}")


if __name__ == "__main__":
    main()
