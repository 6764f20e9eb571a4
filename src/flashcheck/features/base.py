"""What a feature declares, in one record: :class:`Feature`.

A feature is a part of the attention problem a kernel takes as a keyword argument, declared by a spec flag:
a score transform (a cap), an additive bias, a restriction of the keys a query sees, or an extra logit in
each row's denominator. Its module (one per feature, listed by :mod:`flashcheck.features.registry`) says, in
one :class:`Feature`, everything the other layers ask of it: how a value is checked, written, saved and cut,
which spec flag declares it and what a spec must also promise to take it, the regimes cases draw it from, its
neutral value (the exact property), the misreads a diagnosis tries, and the planted bugs that must be caught.
The layers above iterate the registry instead of naming features.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Feature", "Term"]

# What a feature does to the softmax, for the numerics: how they see it.
Term = str  # "cap" | "bias" | "keys" | "sink"
TERMS = ("cap", "bias", "keys", "sink")


@dataclass(frozen=True)
class Feature:
    """One feature of the attention problem (see the module's docstring), its fields by the layer that asks.

    What it is:

    - ``name``: the keyword the kernel receives and the field of :class:`flashcheck.Variant`; ``flag``: the spec
      field that declares it; ``term``: what it is to the numerics (:data:`TERMS`); ``summary``: a line of what
      it does; ``title``: its name in prose, where it differs from ``name``.
    - ``check(value)``: the value checked and normalised (an :class:`~flashcheck.errors.InvalidArgument` naming
      ``name`` otherwise); ``text(value)``: a few characters for a case's description.
    - ``shape_problem(value, shapes)``: (what, why, fix) where the value does not fit the case's shapes, or None;
      ``refusal(variant, spec, dtype)``: why a spec that declares the feature still cannot take this value, or
      None; ``required(spec)``: a kernel of ``spec`` cannot be called without the feature (cases always draw it); ``serving``: a serving form's case may carry it.
    - ``per_query``: a tensor (B, H, Nq, ...) with one entry per query: a sequence's logical case keeps its
      queries' rows, and a serving form hands it to the kernel laid out as q (packed, or (B, Nq, H, ...)).
      ``into_sequences(value, n_k, k_lens)``: a value drawn over a serving case's padded keys (``n_k``) with its
      key positions moved into each sequence's own ``k_lens[b]`` keys (None: it names no key position).

    Drawn and saved cases (:mod:`flashcheck.inputs`):

    - ``regimes``: name -> draw(generator, shapes), or None for "none", which comes first (hypothesis shrinks
      towards it); ``draw(name, regime, gen, shapes, settings)`` calls one (``settings``: the recipe's, as
      :data:`~flashcheck.features.variant.RECIPE_SETTINGS` names them, the bias's dtype always given); ``masks``: boolean-mask regimes the
      feature's restriction gives, name -> draw(generator, shapes).
    - ``fitted``: name -> fit(value, q, k, scale) -> (value, k), for a regime drawn with the case's values: the drawn
      value and k rebuilt from q and k in the input dtype (keys made to tie, the value chosen at the ties).
    - ``settings(spec, dtype, regime, choose)``: the recipe fields
      (:data:`~flashcheck.features.variant.RECIPE_SETTINGS`) a case in ``dtype`` drawing ``regime`` takes from the
      kernel's spec, ``choose(options)`` drawing one of several, or None where the spec takes no such case.
    - ``tensor``: saved with the case's arrays (else in its JSON, through ``to_json``/``from_json``);
      ``saved_dtype``: a tensor's dtype in a saved case (None: the case's JSON gives it); ``dims(value)``: a
      tensor's (batch, head) dims counted from its end (None: it has none), to cut a case; ``cut(value, batch,
      heads, group)``: a record's own cut, where it is no tensor (None: by ``dims``).
    - ``keywords(value, device)``: the keyword arguments the kernel receives for the value, where they are not the
      one keyword ``name`` (a record of several tensors).

    The numerics (:mod:`flashcheck.numerics`, through the Variant's terms):

    - ``visible(value, n_q, n_k, heads_q)``: the mask function of the keys a "keys" feature leaves visible
      (:mod:`flashcheck.contract.masks` convention); ``per_head``: it reads the batch entry and the query head
      (else it is the same for every one); ``kv_heads``: a tensor's head dim counts K/V heads, not query heads;
      ``shown(value, n_q, n_k, heads_q)``: the mask function of keys it shows whatever the rest of the case hides
      (trusted full blocks), or None.
    - ``bias(variant, n_q, n_k, rows, device, size)``: a "bias" feature's float64 bias of ``rows``, broadcastable
      to (B, Hq, R, Nk), or with ``size`` the magnitude a legal kernel's bias arithmetic rounds on;
      ``bias_extent(variant, n_q, n_k)``: a float no smaller than that magnitude on any row and key of the call,
      found without a pass over them (the oracle's bound on the logits).
    - A "keys" feature with a ``bias`` weighs its keys where ``weighs(variant)``: its bias is the log of each key's
      weight (a key listed twice counts twice); ``summed(variant, n_k)``: the most terms a row's sums may then
      hold (every key once: ``n_k``).
    - ``gradient``: the name of the gradient a backward pass gives of a tensor feature (``dbias``), where it is
      judged; None where it is not.

    The judge (:mod:`flashcheck.judge`, :mod:`flashcheck.campaign.causes`):

    - ``neutral(variant, causal, spec, shapes)``: (what, variant, causal) of the case with the feature at its
      neutral value, or None where it has none for this case (:func:`flashcheck.judge.properties.neutral_cases`);
      ``neutral_text``: that value in a few words ("a cap of inf"), for a cause's title.
    - ``reordered(value, spec)``: (what, value, promised) of the value written in another order that gives the
      same exact answer (an index list permuted), ``promised`` whether ``spec`` promises the same bits for it; None
      where it has none;
    - ``row_shift(value, shift, shapes, dtype)``: a "bias" feature's value (None: none) with ``shift``, a
      constant per row ((B, Hq, Nq, 1) float64), added exactly, or None where a sum is not exact in its dtype: the
      bias shift property (:func:`flashcheck.judge.properties.shifted_bias_case`); None where it has none.
    - ``misreads(variant, row)``: (what, logits) of a row (:class:`~flashcheck.features.scores.RowTerms`) with
      the feature read as kernels get it wrong, for a diagnosis to try; ``edge(value, i, j, n_q, n_k, inside)``:
      a "keys" feature's name for key j to query i at its edge (with ``inside`` False, one past it), as a
      diagnosis says it (" (the window's left edge)"), else "".

    Reproducers (:mod:`flashcheck.repro`):

    - ``literal(value)``: a scalar value as Python source, as a script writes the kernel's keyword (a tensor's is
      read from the file beside the script).
    - ``script``: role -> a standalone function (torch and math only, its source copied into a script): a "bias"
      feature's ``"bias"(value, n_q, n_k, dtype, settings)`` (its bias in ``dtype``, broadcastable to (B, Hq, Nq,
      Nk); ``settings``: the variant's, e.g. the ALiBi mode) and ``"score_mod"(value, full, offset, settings)``
      (``term(score, b, h, q_idx, kv_idx)``, its term of flex's score_mod), a "keys" feature's
      ``"mask_mod"(value, offset, device)`` (the mask_mod of its keys), ``"shown_mod"(value, offset, device,
      shown=True)`` (the mask_mod of the keys it shows whatever the rest hides, or None) and ``"weight"(value, n_k,
      device, settings)`` (how often each key counts, multiplying its exp, or None). A value the kernel receives
      as several keywords reaches them as a dict of its scalars and those keywords.
    """

    # what it is
    name: str
    flag: str
    term: Term
    summary: str
    check: Callable
    text: Callable
    regimes: dict
    title: str | None = None
    shape_problem: Callable = lambda value, shapes: None
    refusal: Callable = lambda variant, spec, dtype: None
    required: Callable = lambda spec: False
    serving: bool = True
    per_query: bool = False
    into_sequences: Callable | None = None
    # drawn and saved cases
    draw: Callable = lambda name, regime, gen, shapes, settings: regime(gen, shapes)
    masks: dict = field(default_factory=dict)
    fitted: dict = field(default_factory=dict)
    settings: Callable = lambda spec, dtype, regime, choose: {}
    tensor: bool = False
    saved_dtype: str | None = "fp32"
    dims: Callable = lambda value: (None, None)
    kv_heads: bool = False
    cut: Callable | None = None
    keywords: Callable | None = None
    to_json: Callable = lambda value: value
    from_json: Callable = lambda value: value
    # the numerics
    visible: Callable | None = None
    per_head: bool = False
    shown: Callable | None = None
    bias: Callable | None = None
    bias_extent: Callable | None = None
    weighs: Callable = lambda variant: True
    summed: Callable = lambda variant, n_k: n_k
    gradient: str | None = None
    # the judge
    neutral: Callable | None = None
    neutral_text: str | None = None
    row_shift: Callable | None = None
    reordered: Callable | None = None
    misreads: Callable = lambda variant, row: []
    edge: Callable = lambda value, i, j, n_q, n_k, inside: ""
    # reproducers
    literal: Callable = repr
    script: dict | None = None

    def __post_init__(self):
        if self.term not in TERMS:
            raise ValueError(f"{self.name}: term {self.term!r} is not one of {TERMS}")
        if next(iter(self.regimes), None) != "none" or self.regimes["none"] is not None:
            raise ValueError(f"{self.name}: its regimes start with 'none': None (hypothesis shrinks towards it)")
