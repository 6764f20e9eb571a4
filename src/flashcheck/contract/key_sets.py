"""Sparse attention by index sets: the convention a spec declares with ``key_sets``.

A kernel of this convention receives ``indices``, int32 (B, Hkv or 1, Nq, topk): row (b, h, i) lists the keys
query i of K/V head h attends (1: one list for every K/V head), as DeepSeek V3.2's sparse attention and FlashMLA's
sparse calls take its indexer's top-k. ``-1`` is padding. Its visible keys are the listed ones that the rest of the
case (causal alignment, mask, window) also shows. What real kernels differ on is declared, never guessed:

- ``duplicates``: ``"once"``, a key listed twice is one key (a kernel that builds a mask of the set), or
  ``"twice"``, it counts as often as listed (a kernel that gathers each listed key; the oracle weighs it so);
- ``past_end``: ``"masked"``, an index >= Nk is padding (FlashMLA's fix for out-of-range top-k), or ``"never"``,
  the kernel is never given one (cases hold none);
- ``padding``: ``"anywhere"``, -1 may stand before valid entries, or ``"last"``, only after them;
- ``order_invariant``: permuting a row's entries gives the same bits (else the output stays within its budget);
- ``required``: the kernel cannot be called without ``indices`` (the default; else ``indices`` may be left out,
  which shows every key);

A row whose set shows no key is fully masked: the spec's ``fully_masked_rows`` says what it gets.

On a serving form (``form="varlen"`` or ``"paged"``, MLA's paged decode included) each entry is a position in its
query's own sequence, 0 to that sequence's key count - 1, never a row of the packed k or a slot of the page pool: the
kernel finds the key through ``cu_seqlens_k`` or the block table, as it finds any other key of the sequence. An
index at or past the sequence's key count follows ``past_end``, and the causal alignment is the sequence's own
(bottom-right). ``indices`` is laid out as q: (total_q, Hkv or 1, topk) packed for varlen, (B, Nq, Hkv or 1, topk)
for paged. DeepSeek V3.2's indexer gives such positions; FlashMLA's sparse decode takes them already turned into
cache slots (page * page_size + offset), which vLLM computes from the block table before the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .declared import declared_record

__all__ = ["DUPLICATES", "PAST_END", "PADDING", "KeySets", "key_sets"]

DUPLICATES = ("once", "twice")
PAST_END = ("masked", "never")
PADDING = ("anywhere", "last")

_FIX = ("Declare key_sets=True (duplicates once, indices past the keys masked, padding anywhere) or "
        "key_sets=flashcheck.KeySets(duplicates=..., past_end=..., padding=..., order_invariant=..., required=...).")


@dataclass(frozen=True)
class KeySets:
    """How a kernel reads ``indices`` (see the module's docstring)."""

    duplicates: str = "once"
    past_end: str = "masked"
    padding: str = "anywhere"
    order_invariant: bool = False
    required: bool = True

    def __post_init__(self):
        for name, choices in (("duplicates", DUPLICATES), ("past_end", PAST_END), ("padding", PADDING)):
            if getattr(self, name) not in choices:
                raise InvalidArgument(name, getattr(self, name), "unknown convention",
                                      f"Use one of {list(choices)}. " + _FIX)
        for name in ("order_invariant", "required"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidArgument(name, getattr(self, name), "expected True or False", _FIX)

    def as_dict(self) -> dict:
        return {"duplicates": self.duplicates, "past_end": self.past_end, "padding": self.padding,
                "order_invariant": self.order_invariant, "required": self.required}


def key_sets(value) -> KeySets | None:
    """A spec's ``key_sets`` as a :class:`KeySets`: None or False (no index sets), True (the defaults), a record,
    or a mapping of its fields."""
    return declared_record("key_sets", value, KeySets, KeySets(), _FIX)
