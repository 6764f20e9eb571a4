"""``torch:flex-varlen``: FlexAttention over a packed varlen batch with a document mask (attention-gym's).

The packed q (total_q, Hq, D), k and v become one sequence of a batch of one; a ``mask_mod`` lets query i
see key j only inside its own document (the sequence its offsets give it), with the causal alignment of
that document's own lengths. This is how FlexAttention users write varlen attention.
"""

from __future__ import annotations

import torch

from ..contract.formats import DTYPES
from ..contract.spec import Kernel, KernelSpec
from .flex import check_available, compiled_flex, flex_module, flex_options, run_flex

__all__ = ["NAME", "make_flex_varlen_kernel"]

NAME = "torch:flex-varlen"
DESCRIPTION = ("FlexAttention on the packed batch with a document mask (varlen; causal per document; options "
               "compile=False: unfused eager path)")


def _documents(cu: torch.Tensor):
    """(document of each packed position, its position within the document, each document's length)."""
    lengths = (cu[1:] - cu[:-1]).long()
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    return doc, torch.arange(doc.numel(), device=cu.device) - cu.long()[doc], lengths


def _document_mask(cu_q, cu_k, causal: str):
    doc_q, pos_q, len_q = _documents(cu_q)
    doc_k, pos_k, len_k = _documents(cu_k)
    shift = len_k - len_q if causal == "bottom_right" else torch.zeros_like(len_k)

    def document_mod(b, h, q_idx, kv_idx):
        same = doc_q[q_idx] == doc_k[kv_idx]
        if causal == "none":
            return same
        return same & (pos_k[kv_idx] <= pos_q[q_idx] + shift[doc_q[q_idx]])

    return document_mod


def make_flex_varlen_kernel(*, device: str = "cuda", compile: bool = True) -> Kernel:
    check_available(device, compile, name=NAME)
    returns_lse = not (compile and device == "cpu")
    spec = KernelSpec(form="varlen", dtypes=DTYPES, causal=("none", "top_left", "bottom_right"), gqa=True,
                      min_head_dim=16 if (compile and device == "cuda") else 1, dv_equals_d=False,
                      fully_masked_rows="zero", precision="flash", devices=(device,), nan_safe_masking=False,
                      # flex refuses zero-length inputs (eager: "max(): Expected reduction dim 3 to have non-zero
                      # size"), kept visible in tests/unit/test_flex_varlen.py
                      excludes=("empty_batch",))

    def attention(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, causal="none"):
        fa = flex_module()
        fn = compiled_flex(fa, device) if compile else fa.flex_attention
        q4, k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))

        def mods():
            mask = fa.create_block_mask(_document_mask(cu_seqlens_q, cu_seqlens_k, causal), 1, None, q.shape[0],
                                        k.shape[0], device=q.device)
            return dict(key=k4, value=v4, block_mask=mask)

        result = run_flex(fn, q4, mods, flex_options(fa, scale, q.shape[1] != k.shape[1], returns_lse))
        out, lse = result if returns_lse else (result, None)
        out = out[0].transpose(0, 1)
        if lse is None:
            return out
        return out, getattr(lse, "lse", lse)[0]

    attention.__name__ = attention.__qualname__ = "flex_varlen"
    attention.__doc__ = DESCRIPTION
    return Kernel(attention, spec, name=NAME if compile else f"{NAME}[compile=False]")
