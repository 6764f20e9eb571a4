"""A serving-form case: one logical attention problem per sequence, handed to a kernel packed or paged.

A :class:`ServingCase` keeps the logical problem as a padded dense :class:`~flashcheck.inputs.case.AttentionCase`
(``base``): sequence b is base's batch entry b cut to ``q_lens[b]`` queries and ``k_lens[b]`` keys. The
physical form (:mod:`flashcheck.contract.forms`) is built from it on demand: packed tensors with a poisoned
tail (varlen), or a page pool in which every page and slot no sequence owns is poisoned (paged). The oracle,
the budget and the diagnosis judge each sequence's logical problem (:meth:`ServingCase.groups`), so every
regime and check of the dense form applies to every form.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch

from ..contract.formats import format_of
from ..contract.forms import check_serving_form, output_shapes
from ..errors import InvalidArgument
from ..features.registry import REGISTRY
from .casefile import save_case

# The dense case (flashcheck.inputs.case.AttentionCase) is named in annotations only, never imported: loading a
# saved case of either kind builds a ServingCase there, so that module imports this one. Cases are derived from
# the base with dataclasses.replace, which validates them as AttentionCase.create does.

__all__ = ["POISONS", "ServingCase", "SequenceGroup", "poison_values"]

POISONS = ("huge", "nan")
# Rows of poison after each packed tensor: a read past the last sequence's end meets them.
TAIL = 16


def poison_values(kind: str, k: torch.Tensor) -> tuple[float, float]:
    """(value for K, value for V) of poison ``kind``: NaN, or huge values whose logits stay finite in fp32
    (2^16 times the largest real key, capped by the format), so that only the masking is tested."""
    if kind == "nan":
        return math.nan, math.nan
    fmax = format_of(k).max_value
    return min(fmax, 2.0**16 * max(1.0, float(k.float().abs().max()) if k.numel() else 1.0)), fmax


@dataclass(frozen=True)
class SequenceGroup:
    """Sequences of one case with the same lengths, judged together as one dense case."""

    indices: tuple[int, ...]
    case: AttentionCase  # their logical problem, batch entry i being sequence indices[i]


@dataclass(frozen=True)
class FormInputs:
    """What a kernel of a serving form is called with: three tensors and the form's keywords."""

    tensors: tuple
    kwargs: dict


def _lengths(argument: str, value, count: int, limit: int) -> tuple[int, ...]:
    lengths = tuple(int(n) for n in value)
    if len(lengths) != count or any(n < 0 or n > limit for n in lengths):
        raise InvalidArgument(argument, value, f"expected {count} lengths from 0 to {limit}",
                              f"Pass one length per sequence of base (batch {count}), each at most {limit}.")
    return lengths


def _from_base(name: str) -> property:
    """A read-only attribute of a serving case that is its base's."""
    return property(lambda self: getattr(self.base, name), doc=f"The base case's ``{name}``.")


@dataclass(frozen=True, eq=False)
class ServingCase:
    """A batch of sequences in a serving form (``"varlen"`` or ``"paged"``) over a padded logical ``base``.

    ``max_seqlen_pad``: how far the ``max_seqlen_*`` a varlen kernel receives exceed the longest sequence.
    ``page_size``, ``block_table`` ((B, max_blocks) int32) and ``num_blocks``: the page pool of a paged case;
    table entries past a sequence's pages point at poisoned pages. ``poison`` (:data:`POISONS`): what fills
    memory no sequence owns. ``k_slack`` (varlen only; None: no ``seqused_k``): per sequence, the poisoned key
    slots after its ``k_lens[b]`` used keys inside its ``cu_seqlens_k`` span; the kernel receives ``seqused_k``.
    """

    base: AttentionCase
    form: str
    q_lens: tuple
    k_lens: tuple
    max_seqlen_pad: int = 0
    page_size: int = 0
    block_table: torch.Tensor | None = None
    num_blocks: int = 0
    poison: str = "huge"
    k_slack: tuple | None = None

    def __post_init__(self):
        base = self.base
        check_serving_form(self.form)
        unpacked = [f.name for f in REGISTRY if not f.serving]
        if (base.attn_mask is not None or any(f in base.variant.used for f in unpacked)
                or base.layout.name != "contiguous"):
            raise InvalidArgument("base", base.describe(), f"a serving case's base takes no mask, no "
                                  f"{' or '.join(unpacked)} and the contiguous layout", "Build the base without them.")
        if self.poison not in POISONS:
            raise InvalidArgument("poison", self.poison, "unknown poison", f"Use one of {list(POISONS)}.")
        s = base.shapes
        object.__setattr__(self, "q_lens", _lengths("q_lens", self.q_lens, s.batch, s.n_q))
        object.__setattr__(self, "k_lens", _lengths("k_lens", self.k_lens, s.batch, s.n_k))
        if self.form == "paged":
            self._check_pages()
        if self.k_slack is not None:
            self._check_slack()

    def _check_pages(self) -> None:
        if set(self.q_lens) != {self.base.shapes.n_q}:
            raise InvalidArgument("q_lens", self.q_lens, "a paged case has the same query count per sequence",
                                  f"Pass q_lens={self.base.shapes.n_q} for every sequence.")
        if self.page_size < 1:
            raise InvalidArgument("page_size", self.page_size, "expected at least 1", "Pass page_size >= 1.")
        table = self.block_table
        need = max([self.pages_of(b) for b in range(len(self.k_lens))] + [1])
        if (not isinstance(table, torch.Tensor) or table.dim() != 2 or table.shape[0] != len(self.k_lens)
                or table.shape[1] < need or int(table.min()) < 0 or int(table.max()) >= self.num_blocks):
            raise InvalidArgument("block_table", table, f"expected (B, >= {need}) page indices below num_blocks="
                                  f"{self.num_blocks}", "Build the case with flashcheck.inputs.packing.")
        owned = torch.cat([table[b, :self.pages_of(b)] for b in range(len(self.k_lens))])
        if owned.unique().numel() != owned.numel():
            raise InvalidArgument("block_table", table, "two sequences (or two positions) share a page",
                                  "Give every page that holds keys to one position of one sequence.")
        object.__setattr__(self, "block_table", table.to("cpu", torch.int32).contiguous())

    def _check_slack(self) -> None:
        slack = tuple(int(n) for n in self.k_slack)
        if self.form != "varlen" or len(slack) != len(self.k_lens) or min(slack + (0,)) < 0:
            raise InvalidArgument("k_slack", self.k_slack, f"expected {len(self.k_lens)} counts >= 0 of a varlen case",
                                  "Pass k_slack=None, or one spare key count per sequence with form='varlen'.")
        object.__setattr__(self, "k_slack", slack)

    @property
    def k_spans(self) -> tuple:
        """Each sequence's keys in the packed k and v of the varlen form: its used keys and its slack."""
        return self.k_lens if self.k_slack is None else tuple(n + m for n, m in zip(self.k_lens, self.k_slack))

    # ---- what the case is -------------------------------------------------------------------------

    def pages_of(self, b: int) -> int:
        return -(-self.k_lens[b] // self.page_size)

    @property
    def attn_mask(self):
        return None

    # What the logical problem is (its tensors padded, (B, H, N, D)), as the dense case's: what sizes, names and
    # saves the case.
    q, k, v = _from_base("q"), _from_base("k"), _from_base("v")
    shapes, dtype, torch_dtype = _from_base("shapes"), _from_base("dtype"), _from_base("torch_dtype")
    scale, causal, variant = _from_base("scale"), _from_base("causal"), _from_base("variant")
    layout, provenance = _from_base("layout"), _from_base("provenance")

    def describe(self) -> str:
        form = f"{self.form} q_lens={list(self.q_lens)} k_lens={list(self.k_lens)}"
        if self.form == "paged":
            form += f" page_size={self.page_size} num_blocks={self.num_blocks}"
        elif self.max_seqlen_pad:
            form += f" max_seqlen_pad={self.max_seqlen_pad}"
        if self.k_slack is not None:
            form += f" k_slack={list(self.k_slack)}"
        return f"{self.base.describe()} {form} poison={self.poison}"

    def __repr__(self) -> str:
        return f"ServingCase({self.describe()})"

    def equal_bits(self, other) -> bool:
        return (isinstance(other, ServingCase) and self.base.equal_bits(other.base)
                and self._form_fields() == other._form_fields())

    def _form_fields(self) -> tuple:
        table = None if self.block_table is None else self.block_table.tolist()
        return (self.form, self.q_lens, self.k_lens, self.max_seqlen_pad, self.page_size, table, self.num_blocks,
                self.poison, self.k_slack)

    # ---- the logical problem, by sequence ------------------------------------------------------------

    @functools.cached_property
    def groups(self) -> tuple[SequenceGroup, ...]:
        """The sequences with queries, grouped by their lengths, each group's logical problem as one dense case
        (a sequence without keys as one key hidden from every query: only empty rows)."""
        by_lengths: dict[tuple, list[int]] = {}
        for b, lengths in enumerate(zip(self.q_lens, self.k_lens)):
            if lengths[0]:
                by_lengths.setdefault(lengths, []).append(b)
        return tuple(SequenceGroup(tuple(idx), self._logical(idx, nq, nk)) for (nq, nk), idx in by_lengths.items())

    def _logical(self, idx: list[int], n_q: int, n_k: int) -> AttentionCase:
        base, rows = self.base, torch.tensor(idx)
        q, k, v = (t.index_select(0, rows) for t in (base.q, base.k, base.v))
        mask = None
        if n_k == 0:
            k, v = torch.zeros_like(k[:, :, :1]), torch.zeros_like(v[:, :, :1])
            mask = torch.zeros(1, 1, 1, 1, dtype=torch.bool)
        else:
            k, v = k[:, :, :n_k], v[:, :, :n_k]
        return dataclasses.replace(base, q=q[:, :, :n_q], k=k, v=v, attn_mask=mask,
                                   variant=base.variant.select(rows, queries=slice(0, n_q)))

    # ---- the physical form ------------------------------------------------------------------------------

    def physical(self, device) -> FormInputs:
        """The tensors and keywords a kernel of this form receives, on ``device``, every unowned element poisoned."""
        return self._varlen(device) if self.form == "varlen" else self._paged(device)

    def _poison(self):
        return poison_values(self.poison, self.base.k)

    def _varlen(self, device) -> FormInputs:
        base, (huge_k, huge_v), spans = self.base, self._poison(), self.k_spans
        packed = (self._as_q(base.q, device, huge_k),
                  _packed(base.k, self.k_lens, spans, huge_k, device, alternate=True),
                  _packed(base.v, self.k_lens, spans, huge_v, device))
        pad = self.max_seqlen_pad
        kwargs = {"cu_seqlens_q": _offsets(self.q_lens, device), "cu_seqlens_k": _offsets(spans, device),
                  "max_seqlen_q": max(self.q_lens) + pad, "max_seqlen_k": max(spans) + pad}
        if self.k_slack is not None:
            kwargs["seqused_k"] = torch.tensor(self.k_lens, dtype=torch.int32, device=device)
        return FormInputs(packed, kwargs)

    def _paged(self, device) -> FormInputs:
        base, (huge_k, huge_v) = self.base, self._poison()
        lens = torch.tensor(self.k_lens)
        seq = torch.repeat_interleave(torch.arange(len(self.k_lens)), lens)  # each owned key's sequence and index
        key = torch.arange(seq.numel()) - (torch.cumsum(lens, 0) - lens)[seq]
        page, slot = self.block_table[seq, key // self.page_size].long(), key % self.page_size
        caches = []
        for t, value in ((base.k, huge_k), (base.v, huge_v)):
            pool = torch.full((self.num_blocks, self.page_size, t.shape[1], t.shape[3]), value, dtype=t.dtype)
            pool[page, slot] = t[seq, :, key]
            caches.append(pool.to(device))
        return FormInputs((self._as_q(base.q, device), *caches), {"block_table": self.block_table.to(device),
                                         "cache_seqlens": torch.tensor(self.k_lens, dtype=torch.int32, device=device)})

    def _as_q(self, t: torch.Tensor, device, fill: float = 0.0) -> torch.Tensor:
        """``t`` (B, H, Nq, X) laid out as the form's q: packed (total_q, H, X), the rows past the end ``fill``
        (varlen), or (B, Nq, H, X) (paged)."""
        if self.form == "varlen":
            return _packed(t, self.q_lens, self.q_lens, fill, device)
        return t.transpose(1, 2).contiguous().to(device)

    def variant_kwargs(self, device) -> dict:
        """The variant's keyword arguments as a kernel of the form receives them: a feature with one entry per
        query (an index set) laid out as q."""
        kwargs = self.variant.kwargs(device)
        for f in REGISTRY:
            if f.per_query and f.name in kwargs:
                kwargs[f.name] = self._as_q(getattr(self.variant, f.name), device)
        return kwargs

    def output_shapes(self) -> tuple[tuple, tuple]:
        s = self.shapes
        return output_shapes(self.form, batch=s.batch, heads_q=s.heads_q, n_q=s.n_q, head_dim_v=s.head_dim_v,
                             total_q=sum(self.q_lens))

    def unpack(self, t: torch.Tensor, group: SequenceGroup, *, lse: bool = False) -> torch.Tensor:
        """A kernel's output (or ``lse``) of ``group``'s sequences in the dense layout of its logical case."""
        if self.form == "paged":
            rows = t.index_select(0, torch.tensor(group.indices, device=t.device))
            return rows if lse else rows.transpose(1, 2)
        starts = [sum(self.q_lens[:b]) for b in group.indices]
        n = self.q_lens[group.indices[0]]
        if lse:
            return torch.stack([t[:, s:s + n] for s in starts])
        return torch.stack([t[s:s + n].transpose(0, 1) for s in starts])

    def pack(self, parts: list, *, lse: bool = False, fill: float = 0.0) -> torch.Tensor:
        """:meth:`unpack` undone for every group: ``parts[i]``, of ``groups[i]`` in its dense layout, placed in the
        form's output (or ``lse``) layout, its last dimension kept; rows of no group hold ``fill``."""
        out_shape, lse_shape = self.output_shapes()
        like = parts[0] if parts else torch.empty(out_shape[-1:])
        target = torch.full(lse_shape if lse else out_shape[:-1] + like.shape[-1:], fill, dtype=like.dtype,
                            device=like.device)
        for group, part in zip(self.groups, parts):
            for i, b in enumerate(group.indices):
                if self.form == "paged":
                    target[b] = part[i] if lse else part[i].transpose(0, 1)
                    continue
                start, n = sum(self.q_lens[:b]), self.q_lens[b]
                if lse:
                    target[:, start:start + n] = part[i]
                else:
                    target[start:start + n] = part[i].transpose(0, 1)
        return target

    # ---- related cases, for the properties -----------------------------------------------------------

    def with_base(self, base: AttentionCase) -> "ServingCase":
        return dataclasses.replace(self, base=base)

    def with_provenance(self, provenance: dict) -> "ServingCase":
        return self.with_base(self.base.with_provenance(provenance))

    def with_sequences_poisoned(self, which: torch.Tensor, *, keys: bool = True) -> "ServingCase":
        """This case with the keys (unless ``keys`` is False) and values of the sequences ``which`` (bool (B,))
        replaced by poison."""
        huge_k, huge_v = self._poison()
        k, v = self.base.k.clone(), self.base.v.clone()
        v[which] = huge_v
        if keys:
            k[which] = huge_k
        return self.with_base(dataclasses.replace(self.base, k=k, v=v))

    def only(self, b: int) -> "ServingCase":
        """Sequence ``b`` alone, in the same form (a paged one keeps the whole page pool)."""
        base, keep = self.base, slice(b, b + 1)
        alone = dataclasses.replace(base, q=base.q[keep], k=base.k[keep], v=base.v[keep],
                                    variant=base.variant.select(keep))
        table = None if self.block_table is None else self.block_table[keep]
        slack = None if self.k_slack is None else self.k_slack[keep]
        return dataclasses.replace(self, base=alone, q_lens=self.q_lens[keep], k_lens=self.k_lens[keep],
                                   block_table=table, k_slack=slack)

    def with_pages_permuted(self, seed: int) -> "ServingCase":
        """The same case with the page pool in another order (its block table renumbered)."""
        order = torch.randperm(self.num_blocks, generator=torch.Generator().manual_seed(seed))
        return dataclasses.replace(self, block_table=order[self.block_table.long()].to(torch.int32))

    def save(self, path_stem):
        """Write ``<stem>.npz`` and ``<stem>.json`` atomically (:mod:`flashcheck.inputs.casefile`); return their
        paths."""
        return save_case(self.base, path_stem, serving=self)


def _packed(t: torch.Tensor, lens, spans, value: float, device, *, alternate: bool = False) -> torch.Tensor:
    """``t`` (B, H, N, D) packed as (total, H, D): sequence b's first ``lens[b]`` rows at the start of a span of
    ``spans[b]`` rows, the rest of each span and a tail of :data:`TAIL` rows past the end poisoned with ``value``
    (``alternate``: -value in every other row of a span's rest, so that whatever a query's sign, one of them gives
    it a huge logit)."""
    total, start = sum(spans), 0
    buffer = torch.full((total + TAIL, t.shape[1], t.shape[3]), value, dtype=t.dtype)
    for b, (n, span) in enumerate(zip(lens, spans)):
        buffer[start:start + n] = t[b, :, :n].transpose(0, 1)
        if alternate:
            buffer[start + n + 1:start + span:2] = -value
        start += span
    return buffer.to(device)[:total]


def _offsets(lengths, device) -> torch.Tensor:
    return torch.tensor([0] + [sum(lengths[:b + 1]) for b in range(len(lengths))], dtype=torch.int32, device=device)
