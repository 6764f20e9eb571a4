"""The built-in PyTorch kernels' reproducers call PyTorch's public API (scaled_dot_product_attention under
sdpa_kernel, flex_attention with its block mask and score_mod written out), and on the CPU, where these backends
are correct, they exit 0: masks, biases, ALiBi, soft-cap, window, sinks, GQA and every layout included."""

from __future__ import annotations

import torch

from flashcheck.features.variant import Variant
from flashcheck.inputs.case import AttentionCase
from flashcheck.inputs.layout import Layout

from ._repro import imports_flashcheck, repro, run_without_flashcheck, save_case, tensors


def _reproduced(tmp_path, kernel: str, case: AttentionCase, upstream=None):
    """The reproducer of ``case`` on ``kernel``: its text and its run without flashcheck."""
    path, verdict = save_case(tmp_path / "corpus", kernel, case, upstream=upstream)
    assert verdict.status == "PASS", verdict
    status, printed, errors = repro(path, tmp_path / "out")
    assert status == 0 and "not BUG" in printed, printed + errors  # written anyway, and said so
    assert "> **Note:**" in (tmp_path / "out" / "ISSUE.md").read_text()
    script = tmp_path / "out" / "repro.py"
    return script.read_text(), run_without_flashcheck(script)


def test_torch_math_forward_with_mask_bias_alibi_and_gqa(tmp_path):
    q, k, v = tensors(B=2, Hq=4, Hkv=2, Nq=6, Nk=9)
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(2, 1, 6, 9, generator=g) > 0.3
    mask[0, 0, 2] = False  # a row with no visible key
    variant = Variant(attn_bias=torch.randn(1, 4, 6, 9, generator=g), alibi_slopes=torch.rand(4, generator=g))
    case = AttentionCase.create(q, k, v, scale=-0.2, causal="bottom_right", attn_mask=mask, layout="offset",
                                variant=variant)
    text, run = _reproduced(tmp_path, "torch:math", case)
    assert "scaled_dot_product_attention" in text and "SDPBackend" in text and not imports_flashcheck(text)
    assert "flex_attention" not in text and "def plain_call" not in text  # only the call this case needs
    assert run.returncode == 0, run.stdout + run.stderr
    assert "kernel: torch:math" in run.stdout and "out: every element within its budget" in run.stdout


def test_torch_math_backward(tmp_path):
    q, k, v = tensors(Hq=4, Hkv=2, Nq=6, Nk=9)
    case = AttentionCase.create(q, k, v, scale=0.3, causal="top_left", layout="transposed")
    text, run = _reproduced(tmp_path, "torch:math", case, upstream="aligned")
    assert "scaled_dot_product_attention" in text and not imports_flashcheck(text)
    assert run.returncode == 0, run.stdout + run.stderr
    assert all(f"{n}: every element within its budget" in run.stdout for n in ("dq", "dk", "dv"))


def test_torch_flex_with_every_variant_and_expanded_heads(tmp_path):
    q, k, v = tensors(Hq=4, Hkv=1, Nq=6, Nk=11, dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(2)
    variant = Variant(softcap=5.0, window=(4, 1), sinks=torch.randn(4, generator=g),
                      alibi_slopes=torch.rand(1, 4, generator=g), attn_bias=torch.randn(1, 1, 6, 11, generator=g))
    mask = torch.rand(6, 11, generator=g) > 0.2
    case = AttentionCase.create(q, k, v, scale=0.4, causal="bottom_right", attn_mask=mask, layout=Layout.expanded(),
                                variant=variant)
    text, run = _reproduced(tmp_path, "torch:flex[compile=False]", case)
    assert "flex_attention" in text and "create_block_mask" in text and "def flex_score_mod" in text
    assert "scaled_dot_product_attention" not in text and not imports_flashcheck(text)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "out: every element within its budget" in run.stdout and "lse: every element within its budget" in run.stdout
