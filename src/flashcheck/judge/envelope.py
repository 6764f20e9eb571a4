"""The reordering envelope: how far from the oracle the precision-faithful twin lands over the legal orders
of operations, and a SUSPICIOUS finding for an output inside the budget but far outside that envelope.

The budget bounds every legal order; a kernel many times past the worst of them is likely systematic
(a wrong rounding mode, a bias) even though no element breaks the budget.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from ..inputs.case import AttentionCase
from ..numerics.budget import Budget
from ..numerics.twin import Habits, Tiling, twin_attention
from .comparison import error_ratios, on_oracle_rows
from .verdict import SUSPICIOUS, Finding

__all__ = ["ENVELOPE_FACTOR", "ENVELOPE_FLOOR", "ENVELOPE_TILINGS", "ENVELOPE_ONE_PASS", "reordering_envelope",
           "envelope_findings"]

# An output inside the budget but this many times past the worst legal reordering is SUSPICIOUS.
ENVELOPE_FACTOR = 8.0
# Below this err/budget nothing is suspicious: the budget is loose there and the envelope is noise.
ENVELOPE_FLOOR = 0.05
# The twin's runs whose spread is the envelope: for a tiled contract, tile shapes and key orders
# (block_m, block_n, keys shuffled), the biases added to the natural logits (the first two) or, as exp2
# kernels add them, to the base-2 ones (the last two); for a one-pass contract, where tiles change
# nothing, the orders of operations a kernel may pick (scale on Q and K, softmax before P @ V, keys
# shuffled, and last, as the dearest, each dot product summed one term at a time: the device's BLAS picks
# the other runs' inner order, and a GPU's tree of sums rounds far less than a CPU's running sum). The twin
# walks its key tiles one by one, so the runs go by their number of key tiles, fewest first: a run that
# settles the verdict stops the walk, and on a long row the tiles of 128 keys settle it at an eighth of the
# cost of the tiles of 16 (the verdict is the same in any order; the shuffled runs keep theirs, which draws
# their key orders).
ENVELOPE_TILINGS = ((32, 128, True), (64, 64, False), (128, 32, True), (16, 16, False))
ENVELOPE_ONE_PASS = ((False, False, False, False), (True, True, False, False), (True, False, True, False),
                     (False, True, True, False), (False, False, False, True))


def _envelope_runs(precision, dtype: str) -> list[tuple[Tiling, Habits, bool]]:
    """The twin's runs: each one's tiling, habits, and whether its keys are shuffled."""
    tf32_modes = ("nearest", "truncate") if precision.tf32 and dtype == "fp32" else ("nearest",)
    if precision.rescales_per_tile:
        runs = [(Tiling(m, n), Habits(bias_base2=shuffled), shuffled) for m, n, shuffled in ENVELOPE_TILINGS]
    else:
        runs = [(Tiling(), Habits(scale_inputs=scaled and precision.scale_on_inputs, softmax_first=first,
                                  sequential=sequential), shuffled)
                for scaled, first, shuffled, sequential in ENVELOPE_ONE_PASS]
    return [(tiling, replace(habits, tf32_mode=mode), shuffled) for tiling, habits, shuffled in runs
            for mode in tf32_modes]


def reordering_envelope(case: AttentionCase, budget: Budget, *, device, enough: float = math.inf,
                        head: tuple[int, int] | None = None) -> float:
    """The largest err/budget of the precision-faithful twin over the legal orders of operations.

    It stops once it reaches ``enough`` (past that the verdict cannot change). ``head=(b, h)`` runs the
    twin on that head alone: its envelope is at most the whole case's, and costs a fraction of it.
    """
    q, k, v, mask, variant, ref_parts = _envelope_inputs(case, budget, device, head)
    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for tiling, habits, shuffled in _envelope_runs(budget.precision, case.dtype):
        if shuffled:
            tiling = replace(tiling, key_order=torch.randperm(case.shapes.n_k, generator=gen))
        out, _ = twin_attention(q, k, v, scale=case.scale, causal=case.causal, attn_mask=mask,
                                precision=budget.precision, variant=variant, tiling=tiling, habits=habits)
        ratio, _ = error_ratios(on_oracle_rows(out, budget.reference), *ref_parts)
        worst = max(worst, float(ratio.max()) if ratio.numel() else 0.0)
        if worst >= enough:
            break
    return worst


def _envelope_inputs(case: AttentionCase, budget: Budget, device, head):
    """The twin's inputs and the oracle's (out, budget, empty rows) for the whole case or one head."""
    q, k, v = (t.to(device) for t in (case.q, case.k, case.v))
    mask = None if case.attn_mask is None else case.attn_mask.to(device)
    ref = budget.reference
    parts = (ref.out, budget.total, ref.empty_rows)
    variant = case.variant
    if head is None:
        return q, k, v, mask, variant, parts
    b, h = head
    variant = variant.select(slice(b, b + 1), slice(h, h + 1), group=case.shapes.group)
    kv = h // case.shapes.group
    if mask is not None:
        mask = torch.broadcast_to(mask, (*q.shape[:3], k.shape[2]))[b:b + 1, h:h + 1]
    one = (slice(b, b + 1), slice(h, h + 1))
    return (q[one], k[b:b + 1, kv:kv + 1], v[b:b + 1, kv:kv + 1], mask, variant, tuple(t[one] for t in parts))


def envelope_findings(case: AttentionCase, budget: Budget, max_ratio: float, *, device,
                      regime: str | None = None, out: torch.Tensor | None = None) -> list[Finding]:
    """A SUSPICIOUS finding when the kernel sits far outside the twin's reordering envelope.

    With the kernel's ``out``, the twin first runs on the head of its worst element alone, and on the
    whole case only when that head's envelope leaves the verdict open.
    """
    enough = max_ratio / ENVELOPE_FACTOR
    envelope = 0.0
    if out is not None and budget.reference.shapes.batch * budget.reference.shapes.heads_q > 1:
        envelope = reordering_envelope(case, budget, device=device, enough=enough, head=_worst_head(out, budget))
    if envelope < enough:
        envelope = reordering_envelope(case, budget, device=device, enough=enough)
    # An envelope of 0 (the twin exact everywhere) makes any error an outlier, without dividing by 0.
    envelope_or_tiny = max(envelope, 1e-300)
    if max_ratio <= ENVELOPE_FACTOR * envelope_or_tiny:
        return []
    return [Finding(
        "reordering_outlier", SUSPICIOUS,
        f"inside the hard budget (max error/budget {max_ratio:.3g}) but {max_ratio / envelope_or_tiny:.3g} "
        f"times the worst legal reordering of the twin ({envelope:.3g} over its orders of operations: tilings, "
        f"key orders, where the scale and the normalisation apply); a systematic error below the budget, "
        "or a kernel outside its precision contract",
        ratio=max_ratio, regime=regime, details={"envelope": envelope, "factor": ENVELOPE_FACTOR})]


def _worst_head(out: torch.Tensor, budget: Budget) -> tuple[int, int]:
    ref = budget.reference
    ratio, _ = error_ratios(on_oracle_rows(out, ref), ref.out, budget.total, ref.empty_rows)
    per_head = ratio.flatten(2).amax(-1)
    b, h = divmod(int(per_head.argmax()), per_head.shape[1])
    return b, h
