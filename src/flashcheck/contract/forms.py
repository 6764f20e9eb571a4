"""Serving forms: how a kernel receives a batch of logical attention problems, one per sequence.

``form="dense"`` (the default) is the calling convention of :mod:`flashcheck.contract.spec`. The serving
forms follow flash-attention's conventions:

- ``form="varlen"``: ``kernel(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
  causal, ...)`` with q (total_q, Hq, D), k and v (total_k, Hkv, D) packed sequence after sequence,
  ``cu_seqlens_*`` int32 (B + 1,) offsets starting at 0, ``max_seqlen_*`` ints at least the longest
  sequence; returns out (total_q, Hq, Dv), or ``(out, lse)`` with lse (Hq, total_q). A kernel whose spec
  declares ``seqused_k`` may also receive ``seqused_k``, int32 (B,): sequence b uses only the first
  ``seqused_k[b]`` of the keys from ``cu_seqlens_k[b]`` to ``cu_seqlens_k[b + 1]`` (the rest hold poison).
- ``form="paged"``: ``kernel(q, k_cache, v_cache, *, block_table, cache_seqlens, scale, causal, ...)`` with
  q (B, Nq, Hq, D), caches (num_blocks, page_size, Hkv, D), ``block_table`` int32 (B, max_blocks) (the
  pages of sequence b in order), ``cache_seqlens`` int32 (B,) keys per sequence; returns out (B, Nq, Hq, Dv),
  or ``(out, lse)`` with lse (B, Hq, Nq).

Causal alignment, windows and chunks apply per sequence to its own lengths (bottom-right is
flash-attention's). A sequence with no keys has only empty rows (the spec's ``fully_masked_rows``). The
variant keywords are those of the dense form; ``alibi_slopes`` of shape (B, Hq) has one row per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .counts import check_sizes
from .mla import implied_fields, latent_cache
from .quantization import check_spec

__all__ = ["FORMS", "SERVING_FORMS", "MODULES", "LSE_BASES", "EMPTY_LSE_PROMISES", "CallingForm", "check_serving_form",
           "convention_fields", "output_shapes"]

FORMS = ("dense", "varlen", "paged")
SERVING_FORMS = FORMS[1:]
# Each serving form's module in flashcheck.features, which flashcheck.features.forms loads: the forms above,
# split-KV (a spec's split counts, at which a serving kernel is called) and MLA (one cached row for K and V, on the
# dense or the paged form). A new form is its module and a line here.
MODULES = {"varlen": "varlen", "paged": "paged", "split_kv": "split_kv", "mla": "mla"}
# The forms MLA's one cached row has a convention on (FlashMLA's dense and kvcache calls).
MLA_FORMS = ("dense", "paged")
LSE_BASES = ("e", "2")
EMPTY_LSE_PROMISES = ("-inf", "+inf", "any")


@dataclass(frozen=True)
class CallingForm:
    """How a kernel takes its inputs and returns its lse: the kernel spec's fields of that concern
    (:class:`~flashcheck.contract.spec.KernelSpec` takes and reads them flat).

    ``form``: ``"dense"`` (the default), ``"varlen"`` (packed sequences with offsets) or ``"paged"`` (a paged
    KV cache with a block table), with the conventions above. ``page_sizes``: the page sizes a paged kernel
    takes (None: any). ``seqused_k``: a varlen kernel takes and honours ``seqused_k`` (the keys it uses of each
    sequence's span). ``num_splits``: the split counts of a split-KV kernel (its keyword ``num_splits``); every
    case is judged at each of them, and with ``split_invariant`` they must give the same bits.

    The lse a kernel returns beside its output: ``lse_base`` ``"e"`` (natural log, the default) or ``"2"``
    (log2, FlashInfer's and many Triton kernels' own); ``empty_lse``, its value on a row with no visible key:
    ``"-inf"``, ``"+inf"`` or ``"any"`` (None: -inf where ``fully_masked_rows="zero"``, unchecked otherwise).

    ``mla``: the kernel takes multi-head latent attention's one cached row for K and V
    (:mod:`flashcheck.contract.mla`): None, True (DeepSeek V3's 512 + 64) or a
    :class:`~flashcheck.contract.mla.LatentCache`; it fixes the head dims and takes one KV head. A paged MLA
    kernel may declare ``num_splits`` (split-KV decoding over the cache); the dense MLA form takes none.
    """

    form: str = "dense"
    page_sizes: tuple | None = None
    seqused_k: bool = False
    num_splits: tuple | None = None
    split_invariant: bool = False
    lse_base: str = "e"
    empty_lse: str | None = None
    mla: object = None

    def __post_init__(self):
        if self.lse_base not in LSE_BASES:
            raise InvalidArgument("lse_base", self.lse_base, "unknown base", f"Use one of {list(LSE_BASES)}.")
        if self.empty_lse not in (None,) + EMPTY_LSE_PROMISES:
            raise InvalidArgument("empty_lse", self.empty_lse, "unknown promise",
                                  f"Use None or one of {list(EMPTY_LSE_PROMISES)}.")
        if self.form not in FORMS:
            raise InvalidArgument("form", self.form, "unknown form", f"Use one of {list(FORMS)}.")
        if self.seqused_k and self.form != "varlen":
            raise InvalidArgument("seqused_k", self.seqused_k, f"only the varlen form takes it (form={self.form!r})",
                                  "Declare seqused_k=True with form='varlen' only.")
        object.__setattr__(self, "page_sizes", check_sizes("page_sizes", self.page_sizes))
        object.__setattr__(self, "num_splits", check_sizes("num_splits", self.num_splits))
        object.__setattr__(self, "mla", latent_cache(self.mla))
        if self.mla is not None and self.form not in MLA_FORMS:
            raise InvalidArgument("form", self.form, "MLA is declared for the dense and paged forms only",
                                  "Declare form='dense' (kernel(q, kv, ...)) or form='paged' (FlashMLA's kvcache call).")
        if self.mla is not None and self.num_splits is not None and self.form != "paged":
            raise InvalidArgument("num_splits", self.num_splits, "only the paged MLA form (FlashMLA's kvcache call) "
                                  "takes split counts", "Declare num_splits=None with the dense MLA form, or "
                                  "form='paged'.")

    def check_with(self, spec) -> None:
        """The spec's quantization scheme against its dtypes and its cached row
        (:func:`~flashcheck.contract.quantization.check_spec`)."""
        check_spec(spec.quantization, dtypes=spec.dtypes, latent=None if self.mla is None else self.mla.kv_lora_rank)

    def arguments(self, q, k, v) -> tuple:
        """The tensors a kernel of this form receives of a case's q, k and v (in the form's layout): MLA's one
        cached row serves as K and V (V being K's first columns), so its kernel gets q and k alone."""
        return (q, k) if self.mla is not None else (q, k, v)

    def unsupported(self, shapes) -> str | None:
        """Why the form cannot hold a case of ``shapes``, or None."""
        if self.mla is None:
            return None
        return self.mla.unsupported(shapes.heads_kv, shapes.head_dim, shapes.head_dim_v)


def convention_fields(spec) -> dict:
    """The fields of ``spec`` (a KernelSpec being built) its calling convention fixes, with their values: MLA's
    head dims and heads (:func:`flashcheck.contract.mla.implied_fields`); none for the others."""
    cache = latent_cache(spec.mla)
    return {} if cache is None else implied_fields(cache, head_dims=spec.head_dims)


def check_serving_form(form: str) -> None:
    """InvalidArgument where ``form`` is no serving form."""
    if form not in SERVING_FORMS:
        raise InvalidArgument("form", form, "not a serving form", f"Use one of {list(SERVING_FORMS)}.")


def output_shapes(form: str, *, batch: int, heads_q: int, n_q: int, head_dim_v: int,
                  total_q: int) -> tuple[tuple, tuple]:
    """``(out shape, lse shape)`` a kernel of ``form`` returns (``total_q``: the packed query count)."""
    if form == "varlen":
        return (total_q, heads_q, head_dim_v), (heads_q, total_q)
    if form == "paged":
        return (batch, n_q, heads_q, head_dim_v), (batch, heads_q, n_q)
    return (batch, heads_q, n_q, head_dim_v), (batch, heads_q, n_q)
