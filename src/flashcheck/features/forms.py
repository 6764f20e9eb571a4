"""What a serving form declares, in one record (:class:`Form`), and the forms' registry (:data:`FORMS`).

A serving form is how a kernel receives a batch of sequences (packed, or a KV cache in pages), or how it is called
on one (at each split count of a split-KV kernel); :mod:`flashcheck.contract.forms` lists the forms and their
modules in this package, each declaring its ``FORM``. The layers above ask the record, not the form's name: the
settings a kernel is called at, the regimes a case draws its layout from and the layout drawn, what a saved
case holds of it, the reproducer's index names and entries, the issue's words for the tensors, and the case with
its memory in another order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Callable

from ..contract.forms import MODULES
from ..errors import InvalidArgument

__all__ = ["ARRAYS", "FORMS", "JSON_KEYS", "SCRIPT_KEYS", "Form", "FormDraws", "LayoutDraw", "Setting", "form",
           "form_draws", "form_values", "regimes", "script_entries", "settings", "value_pools"]


@dataclass(frozen=True)
class Form:
    """One serving form (see the module's docstring).

    ``name``: the spec's ``form`` (or the form's own name, for one a spec declares otherwise).
    ``settings(spec)``: the values a kernel of ``spec`` is called at, every case once at each, or None where the
    spec sets none; ``keywords(value)``: the call's keyword arguments at a value; ``label(value)``: the words that
    lead a finding's diagnosis at it. ``script(spec)``: the entries of the reproducer's kernel call the form adds
    (:data:`SCRIPT_KEYS`: their keys, which its ``CASE["form"]`` repeats). ``indices``: the reproducer's names of an
    out and an lse element's index; ``tensors``: q, k, v as the kernel names them; ``text(case)``: the form's own
    words of a case's sequences, for an issue; ``relayout(case)``: the case with its memory in another order that
    must give the same bits, or None (the form has no such order).
    Drawn and saved cases (:mod:`flashcheck.inputs`): ``pool``: the recipe field of the form's own regime, and
    ``regimes``, its values, simplest first; ``pools(spec)``: the form's recipe pools for a kernel of ``spec``
    (field -> regimes); ``layout(draw)``: a case's fields of its physical layout (a :class:`LayoutDraw` gives
    what it draws from); ``decode``: its sequences' queries are a decode step's (a few, the same count each).
    ``json_keys``: the case's fields the form adds to a saved case's JSON, ``arrays``: its arrays (name ->
    dtype) beside the inputs. ``draws(spec)``: the :class:`FormDraws` a kernel of ``spec`` draws its cases with,
    or None (the spec's own limits alone); ``values``: the form's own value regimes, name -> ``change(q, k, v,
    shapes)`` of the drawn values (in their dtype) before V is cut from K, "none" (None) first, drawn for a kernel
    of ``spec`` where ``draws(spec)`` is not None (the recipe's ``form_values``).
    """

    name: str
    settings: Callable | None = None
    keywords: Callable | None = None
    label: Callable | None = None
    script: Callable | None = None
    script_keys: tuple = ()
    indices: dict | None = None
    tensors: tuple = ("q", "k", "v")
    text: Callable = lambda case: ""
    relayout: Callable | None = None
    pool: str | None = None
    regimes: tuple = ()
    pools: Callable = lambda spec: {}
    layout: Callable | None = None
    decode: bool = False
    json_keys: tuple = ()
    arrays: dict = field(default_factory=dict)
    draws: Callable = lambda spec: None
    values: dict = field(default_factory=dict)


@dataclass(frozen=True)
class FormDraws:
    """What a form fixes of the cases drawn for it, beyond the spec's limits: ``heads_kv`` KV heads with 1 to
    ``max_query_heads`` query heads each, 1 to ``max_queries`` queries a sequence, the head dims ``head_dims``
    (:class:`~flashcheck.contract.head_dims.HeadDimPair` s), V as K's first Dv columns (``shared_kv``: the same
    numbers, bit for bit), and the scale the scale regimes start from (``base_scale``; None: 1/sqrt(D))."""

    heads_kv: int
    max_query_heads: int
    max_queries: int
    head_dims: tuple
    shared_kv: bool = False
    base_scale: float | None = None


@dataclass(frozen=True)
class LayoutDraw:
    """What a form's ``layout`` draws a case's layout from: the generator, the logical case's shapes, the key
    count of each sequence and ``lengths(limit)``, which draws counts in the case's length regime ``packing``;
    ``regime``: the form's own (its ``pool``'s); ``same_lengths``: each sequence's queries are its keys."""

    rng: object
    shapes: object
    k_lens: list
    packing: str
    regime: str
    same_lengths: bool
    lengths: Callable


@dataclass(frozen=True)
class Setting:
    """One value a kernel is called at (a split count), with the form that sets it."""

    form: Form
    value: object

    def keywords(self) -> dict:
        return self.form.keywords(self.value)

    def label(self) -> str:
        return self.form.label(self.value)


FORMS: tuple[Form, ...] = tuple(import_module(f"{__package__}.{module}").FORM for module in MODULES.values())
_BY_NAME = {f.name: f for f in FORMS}
_DENSE = Form("dense")  # the spec's own calling convention: a record that declares nothing
SCRIPT_KEYS = tuple(key for f in FORMS for key in f.script_keys)
JSON_KEYS = tuple(key for f in FORMS for key in f.json_keys)
ARRAYS = {name: dtype for f in FORMS for name, dtype in f.arrays.items()}


def form(name: str) -> Form:
    return _DENSE if name == _DENSE.name else _BY_NAME[name]


def regimes(pool: str) -> tuple:
    """The regimes of the recipe field ``pool`` that a form draws its layout from."""
    return next(f.regimes for f in FORMS if f.pool == pool)


def settings(spec) -> tuple:
    """The :class:`Setting` s a kernel of ``spec`` is called at, in order; ``(None,)``: one plain call."""
    for f in FORMS:
        values = f.settings(spec) if f.settings else None
        if values:
            return tuple(Setting(f, v) for v in values)
    return (None,)


def form_draws(spec) -> FormDraws | None:
    """What the forms a kernel of ``spec`` declares fix of its drawn cases (None: nothing)."""
    return next((d for d in (f.draws(spec) for f in FORMS) if d is not None), None)


def value_pools(spec, chosen=None) -> dict:
    """The recipe pool of the value regimes of the forms a kernel of ``spec`` draws with (none: no pool), of those
    ``chosen`` names (None: all; "none" is always drawn, first). A name no form has is an InvalidArgument."""
    if chosen is not None:
        known = ["none", *(name for f in FORMS for name in f.values if name != "none")]
        bad = sorted(set(chosen) - set(known))
        if bad:
            raise InvalidArgument("form_values", list(chosen), f"unknown form value regimes {bad}",
                                  f"Choose from {known}.")
    names = [name for f in FORMS if f.values and f.draws(spec) is not None for name in f.values
             if chosen is None or name == "none" or name in chosen]
    return {"form_values": names} if names else {}


def form_values(name: str, q, k, v, shapes) -> tuple:
    """q, k, v changed by the form's value regime ``name`` ("none": as they are)."""
    change = next(f.values[name] for f in FORMS if name in f.values) if name != "none" else None
    return (q, k, v) if change is None else change(q, k, v, shapes)


def script_entries(spec) -> dict:
    """The entries the forms add to the reproducer's kernel call of a kernel of ``spec``."""
    return {key: value for f in FORMS if f.script for key, value in f.script(spec).items()}
