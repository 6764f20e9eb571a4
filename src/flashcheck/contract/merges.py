"""What a merge of split-KV partial states is called with and promises (:func:`flashcheck.check_merge`).

``convention="states"``: ``merge(outs, lses) -> (out, lse)`` merges S states at once, outs (S, R, Dv) and lses
(S, R), as FlashInfer's ``merge_states``. ``convention="pair"``: ``merge(out_a, lse_a, out_b, lse_b) -> (out,
lse)`` merges two, out (R, Dv) and lse (R,), as FlashInfer's ``merge_state`` and vLLM's ``merge_attn_states``;
S states are folded pairwise, ((s1 + s2) + s3) + ... The lse are fp32 in ``lse_base`` ("e" or "2"), -inf for a
state that saw no key; a row whose states are all empty gives out 0 and the lse ``empty_lse`` names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import InvalidArgument
from .forms import EMPTY_LSE_PROMISES, LSE_BASES

__all__ = ["MERGE_CONVENTIONS", "MergeConventions"]

MERGE_CONVENTIONS = ("states", "pair")


@dataclass(frozen=True)
class MergeConventions:
    """How a merge is called (``convention``), the base of its lse and what it gives a row with no live state."""

    convention: str = "states"
    lse_base: str = "e"
    empty_lse: str = "-inf"

    def __post_init__(self):
        for name, known in (("convention", MERGE_CONVENTIONS), ("lse_base", LSE_BASES),
                            ("empty_lse", EMPTY_LSE_PROMISES)):
            value = getattr(self, name)
            if value not in known:
                raise InvalidArgument(name, value, "unknown convention", f"Use one of {list(known)}.")

    @property
    def pairwise(self) -> bool:
        return self.convention == "pair"

    @property
    def signature(self) -> str:
        """The call the merge gets, for messages."""
        return "merge_fn(out_a, lse_a, out_b, lse_b)" if self.pairwise else "merge_fn(outs, lses)"

    def describe(self) -> str:
        return f"convention {self.convention}, lse base {self.lse_base}, empty lse {self.empty_lse}"

    def as_dict(self) -> dict:
        return asdict(self)
