"""What a serving form declares, in one record (:class:`Form`), and the forms' registry (:data:`FORMS`).

A serving form is how a kernel receives a batch of sequences (packed, or a KV cache in pages), or how it is called
on one (at each split count of a split-KV kernel); :mod:`flashcheck.contract.forms` lists the forms and their
modules in this package, each declaring its ``FORM``. The layers above ask the record, not the form's name: the
settings a kernel is called at, the reproducer's index names and entries, the issue's words for the tensors, and
the case with its memory in another order.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Callable

from ..contract.forms import MODULES

__all__ = ["FORMS", "SCRIPT_KEYS", "Form", "Setting", "form", "script_entries", "settings"]


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
SCRIPT_KEYS = tuple(key for f in FORMS for key in f.script_keys)


def form(name: str) -> Form:
    return _BY_NAME[name]


def settings(spec) -> tuple:
    """The :class:`Setting` s a kernel of ``spec`` is called at, in order; ``(None,)``: one plain call."""
    for f in FORMS:
        values = f.settings(spec) if f.settings else None
        if values:
            return tuple(Setting(f, v) for v in values)
    return (None,)


def script_entries(spec) -> dict:
    """The entries the forms add to the reproducer's kernel call of a kernel of ``spec``."""
    return {key: value for f in FORMS if f.script for key, value in f.script(spec).items()}
