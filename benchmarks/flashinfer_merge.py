"""FlashInfer's Triton two-state merge (``flashinfer.triton.cascade.merge_state``) as a pair merge of flashcheck's
``check_merge(convention="pair")``: (rows, Dv) states and (rows,) base-2 lse. No flashcheck import, so that a
reproducer of a saved case runs where flashcheck is not installed.

Its wrapper asserts CUDA tensors on a Hopper GPU; without a GPU those two checks are lifted so that the Triton
interpreter (TRITON_INTERPRET=1) runs the same Triton kernel."""

import torch
import flashinfer.triton.cascade as cascade

if not torch.cuda.is_available():
    cascade.check_input = lambda tensor: None
    cascade.check_device = lambda tensors, major: None


def merge(out_a, lse_a, out_b, lse_b):
    """``merge_state`` on its (tokens, heads, Dv) layout, one head."""
    v, s = cascade.merge_state(*(t.unsqueeze(1).contiguous() for t in (out_a, lse_a, out_b, lse_b)))
    return v[:, 0], s[:, 0]
