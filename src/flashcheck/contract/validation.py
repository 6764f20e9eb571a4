"""Checks of the attention calling convention shared by every public entry point.

One function validates (q, k, v, scale, causal, attn_mask) so the oracle, the kernels and saved cases
refuse bad input with the same words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidArgument
from .formats import format_of

__all__ = ["CAUSAL_MODES", "Shapes", "as_tensor", "broadcasts_to", "check_attention_inputs", "check_causal",
           "check_scale"]

CAUSAL_MODES = ("none", "top_left", "bottom_right")


@dataclass(frozen=True)
class Shapes:
    batch: int
    heads_q: int
    heads_kv: int
    n_q: int
    n_k: int
    head_dim: int
    head_dim_v: int

    @property
    def group(self) -> int:
        """Query heads per key/value head (GQA ratio)."""
        return self.heads_q // self.heads_kv


def as_tensor(value: object, argument: str) -> torch.Tensor:
    """Accept a torch tensor or a numpy array; anything else is refused by name."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise InvalidArgument(
        argument, value, "expected a torch.Tensor (or numpy array)",
        f"Pass {argument} as a torch tensor of shape (B, H, N, D).",
    )


def check_causal(causal: object, argument: str = "causal") -> str:
    if causal is None or causal is False:
        return "none"
    if causal in CAUSAL_MODES:
        return str(causal)
    fix = f"Use one of {list(CAUSAL_MODES)}"
    if causal is True:
        fix += " (True is ambiguous: say 'top_left' or 'bottom_right')"
    raise InvalidArgument(argument, causal, "unknown causal alignment", fix + ".")


def check_scale(scale: object, argument: str = "scale") -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
        raise InvalidArgument(argument, scale, "expected a real number",
                              "Pass the softmax scale as a Python float, e.g. 1 / sqrt(D).")
    value = float(scale)
    if not math.isfinite(value):
        raise InvalidArgument(argument, scale, "the softmax scale must be finite",
                              "Pass a finite float, e.g. 1 / sqrt(D).")
    return value


def broadcasts_to(shape: tuple, target: tuple) -> bool:
    # By hand: torch.broadcast_shapes imports sympy (through torch.fx) on its first call, ~0.25 s.
    return len(shape) <= len(target) and all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_attention_inputs(q, k, v, *, scale, causal, attn_mask=None):
    """Validate one attention call; return ``(q, k, v, scale, causal, attn_mask, shapes)``.

    Tensors are returned as given (views stay views); numpy arrays become tensors.
    """
    q, k, v = as_tensor(q, "q"), as_tensor(k, "k"), as_tensor(v, "v")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise InvalidArgument(name, t, f"expected 4 dimensions (B, H, N, D), got {t.dim()}",
                                  f"Reshape {name} to (batch, heads, sequence, head_dim).")
        format_of(t, argument=f"{name}.dtype")
        if 0 in t.shape:
            raise InvalidArgument(name, t, "empty dimension",
                                  "Every dimension of q, k and v must be at least 1.")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise InvalidArgument(name, t, f"dtypes differ: q {q.dtype}, k {k.dtype}, v {v.dtype}",
                                  "Cast q, k and v to one dtype.")
        if t.device != q.device:
            raise InvalidArgument(name, t, f"devices differ: q {q.device}, k {k.device}, v {v.device}",
                                  "Move q, k and v to one device.")
    B, Hq, Nq, D = q.shape
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != B:
            raise InvalidArgument(name, t, f"batch size differs from q's ({B})",
                                  "q, k and v need the same batch size.")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise InvalidArgument("v", v, f"k is {tuple(k.shape)}: heads and length must match k's",
                              "k and v need the same number of heads and keys.")
    Hkv, Nk = k.shape[1], k.shape[2]
    if k.shape[3] != D:
        raise InvalidArgument("k", k, f"head dim {k.shape[3]} differs from q's {D}",
                              "q and k need the same head dim.")
    if Hq % Hkv:
        raise InvalidArgument("k", k, f"q has {Hq} heads, not a multiple of k's {Hkv}",
                              "For GQA the number of query heads must be a multiple of key heads.")
    shapes = Shapes(B, Hq, Hkv, Nq, Nk, D, v.shape[3])
    scale = check_scale(scale)
    causal = check_causal(causal)
    if attn_mask is not None:
        attn_mask = as_tensor(attn_mask, "attn_mask")
        if attn_mask.dtype != torch.bool:
            raise InvalidArgument("attn_mask", attn_mask, "expected a boolean mask (True = may attend)",
                                  "Pass a torch.bool tensor; additive float masks are not supported.")
        if attn_mask.dim() > 4:
            raise InvalidArgument("attn_mask", attn_mask, "more than 4 dimensions",
                                  "The mask must broadcast to (B, Hq, Nq, Nk).")
        if not broadcasts_to(tuple(attn_mask.shape), (B, Hq, Nq, Nk)):
            raise InvalidArgument("attn_mask", attn_mask, f"does not broadcast to {(B, Hq, Nq, Nk)}",
                                  "The mask must broadcast to (B, Hq, Nq, Nk).")
        if attn_mask.device != q.device:
            raise InvalidArgument("attn_mask", attn_mask, f"on {attn_mask.device}, q on {q.device}",
                                  "Move the mask to q's device.")
    return q, k, v, scale, causal, attn_mask, shapes
