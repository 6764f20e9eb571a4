"""ALiBi: ``alibi_slopes`` ((Hq,) or (B, Hq) fp32; spec ``alibi="symmetric"`` or ``"linear"``), a bias added to the
scaled logits, ``-slope * |i + Nk - Nq - j|`` (flash-attention's) or ``slope * (j - i)`` (FlashInfer's and
attention-gym's). The mode belongs to the kernel; a case records the one it was drawn for (``Variant.alibi``)."""

from __future__ import annotations

import torch

from ..errors import InvalidArgument
from .base import Feature
from .scores import RowTerms
from .tensors import as_float_tensor, head_values_text

__all__ = ["FEATURE", "alibi_bias", "alibi_score", "geometric"]


def _check(slopes):
    if slopes is None:
        return None
    fix = "Pass alibi_slopes as a finite float32 tensor of shape (Hq,) or (B, Hq)."
    t = as_float_tensor("alibi_slopes", slopes, fix, (1, 2))
    if not bool(torch.isfinite(t).all()):
        raise InvalidArgument("alibi_slopes", slopes, "contains infinity", fix)
    return t.to("cpu", torch.float32).clone()


def _shape_problem(slopes, shapes):
    B, Hq = shapes.batch, shapes.heads_q
    if tuple(slopes.shape) not in ((Hq,), (B, Hq)):
        return (tuple(slopes.shape), f"expected shape ({Hq},) or ({B}, {Hq})",
                "Pass one slope per query head, or per batch entry and query head.")
    return None


def _refusal(variant, spec, dtype):
    if variant.alibi != spec.alibi:
        return f"uses ALiBi {variant.alibi!r}, the kernel's spec declares alibi={spec.alibi!r}"
    return None


def _bias(variant, n_q: int, n_k: int, rows: torch.Tensor, device, size: bool):
    """The ALiBi term of ``rows``, (B or 1, Hq, R, Nk) float64; with ``size``, |slope| (|i' - j| + |i'| + j), since
    a kernel may form it as slope * j - slope * i' (a per-row constant apart, the same softmax) and round each
    product."""
    symmetric = variant.alibi == "symmetric"
    i = (rows + (n_k - n_q)).view(-1, 1).double() if symmetric else rows.view(-1, 1).double()
    j = torch.arange(n_k, device=device, dtype=torch.float64).view(1, -1)
    pos = -(i - j).abs() if symmetric else j - i
    pos = (i - j).abs() + i.abs() + j if size else pos
    slopes = variant.alibi_slopes.to(device, torch.float64)
    slopes = slopes.abs() if size else slopes
    return slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * pos


def _bias_extent(variant, n_q: int, n_k: int) -> float:
    """|slope| (|i' - j| + |i'| + j), :func:`_bias`'s size, bounded over every row and key at once."""
    return float(variant.alibi_slopes.abs().max()) * (3 * max(n_q, n_k) + abs(n_k - n_q))


def _misreads(variant, row: RowTerms) -> list:
    slopes = variant.alibi_slopes.double().reshape(-1, variant.alibi_slopes.shape[-1])
    slope = float(slopes[row.b if slopes.shape[0] > 1 else 0, row.h])
    j = torch.arange(row.n_k, dtype=torch.float64)
    top_left = slope * (-(row.i - j).abs() if variant.alibi == "symmetric" else j - row.i)
    own = row.biases["alibi_slopes"]
    return [("ALiBi ignored", row.logits(biases={"alibi_slopes": None})),
            ("ALiBi slopes negated", row.logits(biases={"alibi_slopes": -own})),
            # one key more distance: -slope (|d| + 1) symmetric, slope (j - i - 1) linear
            ("ALiBi one key off (distance + 1)", row.logits(biases={"alibi_slopes": own - slope})),
            ("ALiBi aligned top-left", row.logits(biases={"alibi_slopes": top_left}))]


def alibi_bias(slopes, n_q, n_k, dtype, settings):
    """The ALiBi term in ``dtype``, (B or 1, Hq, Nq, Nk): -slope |i + Nk - Nq - j| where ``settings["alibi"]`` is
    "symmetric", else slope (j - i). Torch only: a reproducer script copies it."""
    i = torch.arange(n_q, device=slopes.device, dtype=dtype).view(-1, 1)
    j = torch.arange(n_k, device=slopes.device, dtype=dtype).view(1, -1)
    pos = -(i + (n_k - n_q) - j).abs() if settings["alibi"] == "symmetric" else j - i
    slopes = slopes.to(dtype)
    return slopes.reshape(-1 if slopes.dim() == 2 else 1, slopes.shape[-1], 1, 1) * pos


def alibi_score(slopes, full, offset, settings):
    """The ALiBi term of flex's score_mod, the fp32 slopes read at [b, h] (``offset``: Nk - Nq). Torch only: a
    reproducer script copies it."""
    slopes = slopes.to(torch.float32).expand(full[:2])
    if settings["alibi"] == "linear":  # slope (j - i)
        return lambda score, b, h, q_idx, kv_idx: score + slopes[b, h] * (kv_idx - q_idx)
    return lambda score, b, h, q_idx, kv_idx: score - slopes[b, h] * (q_idx + offset - kv_idx).abs()


def geometric(heads: int) -> torch.Tensor:
    """The ALiBi paper's slopes, 2^(-8 k / H) for k = 1..H."""
    return torch.exp2(-8.0 * torch.arange(1, heads + 1, dtype=torch.float32) / heads)


FEATURE = Feature(
    name="alibi_slopes", flag="alibi", term="bias", summary="a bias of slope times the query-key distance",
    check=_check, text=head_values_text, tensor=True,
    dims=lambda value: (-2, -1) if value is not None and value.dim() == 2 else (None, -1),
    shape_problem=_shape_problem, refusal=_refusal, bias=_bias, misreads=_misreads,
    bias_extent=_bias_extent,
    settings=lambda spec, dtype, regime, choose: {"alibi_mode": spec.alibi}, title="ALiBi",
    script={"bias": alibi_bias, "score_mod": alibi_score},
    # (Hq,) or (B, Hq) fp32; the bias reaches slope * Nk on long rows
    regimes={
        "none": None,
        "geometric": lambda gen, s: geometric(s.heads_q),  # a slope indexed by the K/V head shows under GQA
        "per_batch": lambda gen, s: torch.exp2(-8 * torch.rand(s.batch, s.heads_q, generator=gen)),
        "steep": lambda gen, s: 1 + 7 * torch.rand(s.heads_q, generator=gen),  # the bias outweighs the logits
        "tiny": lambda gen, s: 1e-4 * (1 + torch.rand(s.heads_q, generator=gen)),  # lost if rounded with the logits
        "negative": lambda gen, s: -geometric(s.heads_q),  # allowed: a kernel that takes |slope| flips them
    },
)
