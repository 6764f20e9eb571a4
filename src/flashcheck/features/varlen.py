"""The varlen form: sequences packed one after another, found through ``cu_seqlens_q`` and ``cu_seqlens_k``
(:mod:`flashcheck.contract.forms` gives the convention). A case's ``max_seqlen_*`` may exceed its longest
sequence, and a kernel that takes ``seqused_k`` finds poisoned key slots after each sequence's used keys
(:data:`SEQUSED_REGIMES`)."""

from __future__ import annotations

import numpy as np

from ..errors import InvalidArgument
from .forms import Form, LayoutDraw

# seqused_k: not passed, or passed with 0 to MAX_SLACK poisoned key slots after each sequence's used keys (one
# sequence at least has some).
SEQUSED_REGIMES = ("none", "slack")
MAX_SLACK = 40


def _pools(spec) -> dict:
    # only a kernel that takes seqused_k has the pool: the others' draws stay those of before it
    return {"seqused": list(SEQUSED_REGIMES)} if spec.seqused_k else {}


def _slack(regime: str, batch: int, rng: np.random.Generator) -> tuple | None:
    if regime == "none":
        return None
    if regime != "slack":
        raise InvalidArgument("seqused", regime, "unknown key-use regime", f"Use one of {list(SEQUSED_REGIMES)}.")
    out = rng.integers(0, MAX_SLACK + 1, batch)
    out[int(rng.integers(batch))] = int(rng.integers(1, MAX_SLACK + 1))
    return tuple(out.tolist())


def _layout(d: LayoutDraw) -> dict:
    q_lens = list(d.k_lens) if d.same_lengths else d.lengths(d.shapes.n_q)
    pad = int(d.rng.integers(1, 64)) if d.packing == "padded_max" else 0
    return {"q_lens": q_lens, "max_seqlen_pad": pad, "k_slack": _slack(d.regime, d.shapes.batch, d.rng)}


FORM = Form("varlen", indices={"out": "[t, h, k]", "lse": "[h, t]"}, pool="seqused", regimes=SEQUSED_REGIMES,
            pools=_pools, layout=_layout, json_keys=("max_seqlen_pad",))
