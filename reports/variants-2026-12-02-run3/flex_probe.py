"""The controls of FlexAttention's shared-memory crash (H200): the shrunk case's shapes with other head dims,
with and without its fp32 bias. Run from the repository root on a CUDA host: python3 THIS_FILE."""

import torch

import flashcheck
from flashcheck import AttentionCase
from flashcheck.inputs.casefile import load_case

SHRUNK = "reports/variants-2026-12-02-run3/h200/flex-cases/torch-flex-crash-shrunk-990ef1b330.json"
CUTS = [(172, 204, False), (256, 256, False), (256, 256, True), (192, 192, False), (172, 128, False),
        (128, 204, False)]

c = load_case(SHRUNK)
g = torch.Generator().manual_seed(0)


def cut(d, dv, bias=True):
    q = torch.randn(1, 4, 192, d, generator=g).half()
    k = torch.randn(1, 4, 4, d, generator=g).half()
    v = torch.randn(1, 4, 4, dv, generator=g).half()
    return AttentionCase.create(q, k, v, scale=d ** -0.5, variant=c.variant if bias else None)


for d, dv, bias in CUTS:
    v = flashcheck.check("torch:flex", cut(d, dv, bias), device="cuda", properties=())
    print("flex fp16 D", d, "Dv", dv, "bias", bias, v.status, (v.findings[0].diagnosis[:60] if v.findings else ""),
          flush=True)
