"""The reproducer's text: the script template (:mod:`flashcheck.repro._script`, a real module, so that it is linted
and its functions can be tested) with the case's data in place of ``CASE``, the kernel's call in place of ``CALL``
(for a built-in, the functions of :mod:`flashcheck.repro._script_calls` its call needs, copied in) and the part of
the case's form in place of ``@FORM@``: :mod:`._script_dense`, :mod:`._script_serving` or :mod:`._script_merge`.
The variant's section, in place of ``@VARIANT@``, comes from its features' records: each scalar keyword as its
feature writes it (``Feature.literal``), and the features' own code for the script's tables of each term
(``Feature.script``), so that this package names no feature.

Every script reads its arrays (inputs, budgets, dO) from the tensors file beside it
(:class:`~flashcheck.repro.arrays.TensorFile`); ``CASE`` names each one's array and view."""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import inspect
import platform
import pprint
import sys
from pathlib import Path

import torch

from ..features import forms
from ..features.registry import REGISTRY, feature
from ..features.variant import SETTINGS
from ..judge.merge import fold_states
from ..kernels.flex import flex_sink_key
from ..numerics.merge import merge_reference
from ._script import package_version
from .arrays import TensorFile
from .evidence import Evidence

__all__ = ["copied", "generated_versions", "script_data", "script_frame", "script_text", "serving_data",
           "with_tensor_file"]

_HERE = Path(__file__).resolve().parent
_CASE_LINE = "CASE: dict = {}  # @CASE@"
_CALL_LINE = "CALL = plain_call  # @CALL@"
_CALLS_START = "\n# ---- calls ----\n"  # on a line of its own (the docstring names it too)
_FORM_LINE = "INPUTS = RUN = JUDGE = None  # @FORM@: what the case's form reads, runs and judges (see _script_dense.py)"
_FORM_START = "\n# ---- form ----\n"
_VARIANT_START = "# ---- the variant: "  # the section's first line: its comment, then the @VARIANT@ line
_VARIANT_LINE = ("SHOWN_MODS, WEIGHTS, RECORDS = {}, {}, {}\n"
                 "KEYWORDS, CAPS, BIASES, MASK_MODS, SINK_LOGITS, SCORE_MODS = {}, (), {}, {}, (), {}  # @VARIANT@")
# The script's tables of the variant (see _script.py): the keywords of a term's features, as they are; and a role of
# the features' script code (Feature.script) -> its table, with the kinds of call that need it (None: every script).
_TERM_TABLES = {"cap": "CAPS", "sink": "SINK_LOGITS"}
_ROLE_TABLES = {"bias": ("BIASES", None), "mask_mod": ("MASK_MODS", None), "shown_mod": ("SHOWN_MODS", None),
                "weight": ("WEIGHTS", None), "score_mod": ("SCORE_MODS", "flex")}
# What a form's script leaves out of the template: a dense case's call, and for a merge the attention too.
_LEFT_OUT = {"dense": (), "serving": ("plain_call",),
             "merge": ("plain_call", "inputs", "scale", "as_4d", "causal_visible", "dequantized", "score_bias",
                       "visible", "attention64")}
_SHARED = {"merge": (merge_reference, fold_states)}  # flashcheck's own functions a merge script copies in


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def generated_versions(call: dict, device: str) -> dict:
    """What the machine that generated the script runs: the issue reports them, the script prints its own."""
    package = "torch" if call["kind"] != "plain" else call["target"].split(":")[0]
    where = (torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda"
             else f"CPU ({platform.processor() or platform.machine() or 'cpu'})")
    return {"torch": torch.__version__, "triton": _version("triton"), "kernel package": package_version(package),
            "python": platform.python_version(), "device": where, "flashcheck": _version("flashcheck")}


def _kwargs(case, encode) -> dict:
    """The variant's tensor keyword arguments as data, their bits in the tensors file (the others are written in the
    script, :func:`_variant_code`)."""
    return {name: encode(value, f"kwargs.{name}") for name, value in case.variant.kwargs("cpu").items()
            if isinstance(value, torch.Tensor)}


def _variant_code(variant, kind: str) -> str:
    """The script's variant section, in place of the template's ``@VARIANT@`` line: its keywords that are no tensor,
    each written by its feature (``Feature.literal``), the features' code the ``kind`` of call needs, copied
    (``Feature.script``), and the tables that name them by keyword."""
    used = [feature(name) for name in variant.used]
    given = {f.name: f.keywords(getattr(variant, f.name), "cpu") for f in used if f.keywords}  # records' keywords
    scalars = [f"{f.name}={f.literal(getattr(variant, f.name))}" for f in used if not (f.tensor or f.keywords)]
    scalars += [f"{n}=None" for keywords in given.values() for n, v in keywords.items() if v is None]
    records = {name: _record(feature(name), getattr(variant, name), keywords) for name, keywords in given.items()}
    tables = [f"{table} = {tuple(f.name for f in used if f.term == term)!r}" for term, table in _TERM_TABLES.items()]
    functions = {}  # one copy of a function that fills two tables
    for role, (table, needs) in _ROLE_TABLES.items():
        code = {f.name: f.script[role] for f in used if role in (f.script or {})}
        if needs in (None, kind):
            functions.update({fn.__name__: inspect.getsource(fn) for fn in code.values()})
            tables.append(f"{table} = {{{', '.join(f'{name!r}: {fn.__name__}' for name, fn in code.items())}}}")
    tables.append(f"RECORDS = {records!r}")
    return "\n\n".join([f"KEYWORDS = dict({', '.join(scalars)})\n", *functions.values(), "\n".join(tables)])


def _record(f, value, keywords: dict) -> dict:
    """A record the kernel receives as several ``keywords`` (``Feature.keywords``), as the script's RECORDS hold
    it: its scalars as its JSON holds them, and the names of its keywords (their tensors: the tensors file)."""
    return {**{k: v for k, v in f.to_json(value).items() if k not in keywords}, "keywords": list(keywords)}


def _grad_keywords(variant) -> list:
    """The variant's tensors whose gradients flashcheck takes (a backward run gives them requires_grad)."""
    return [f.name for f in REGISTRY if f.gradient and getattr(variant, f.name) is not None]


def _per_sequence(variant) -> dict:
    """keyword -> its batch dim, of the variant's tensors given per batch entry (a serving script cuts each
    sequence's)."""
    out = {}
    for f in REGISTRY:
        value = getattr(variant, f.name)
        batch = f.dims(value)[0] if f.tensor and value is not None else None
        if batch is not None and value.dim() + batch >= 0:
            out[f.name] = value.dim() + batch
    return out


def copied(t: torch.Tensor) -> torch.Tensor:
    """A fresh contiguous CPU tensor: its storage is exactly its elements."""
    return t.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def script_frame(call: dict, evidence: Evidence, *, describe: str, device: str, title: str, versions: dict) -> dict:
    """What every script's ``CASE`` starts with: the title, the call, where it ran, the case and the diagnosis."""
    return {"title": title, "kernel": call, "device": torch.device(device).type, "byteorder": sys.byteorder,
            "describe": describe, "diagnosis": evidence.diagnosis, "generated": versions}


def _attention(case) -> dict:
    out = {"scale": case.scale.hex(), "causal": case.causal,
           "settings": {name: getattr(case.variant, name) for name in SETTINGS}}
    if case.variant.quantized and case.variant.quantization.block_scaled:  # the script's dequantization reads them
        out["blocks"] = {name: None if b is None else {"size": b.size, "axis": b.axis}
                         for name, b in zip("qkv", case.variant.quantization.blocks)}
    return out


def script_data(case, call: dict, evidence: Evidence, tensors: TensorFile, *, device: str, title: str,
                versions: dict) -> dict:
    """The ``CASE`` of a dense case's script: the inputs as the kernel received them, the budgets (and dO) and what
    to print, their bits in ``tensors``."""
    q, k, v, mask = case.to_device("cpu")  # the case's layout: the same bits and strides on any device
    s = case.shapes
    describe = case.describe() + (f", dO {case.provenance.get('upstream')}" if evidence.backward else "")
    return {
        **script_frame(call, evidence, describe=describe, device=device, title=title, versions=versions),
        **_attention(case), "shapes": {"out": [s.batch, s.heads_q, s.n_q, s.head_dim_v]},
        "inputs": {n: tensors.encode(t, f"inputs.{n}") for n, t in zip(("q", "k", "v", "attn_mask"), (q, k, v, mask))},
        "kwargs": _kwargs(case, tensors.encode), "backward": evidence.backward,
        "grad_keywords": _grad_keywords(case.variant),
        "do": None if evidence.do is None else tensors.encode(copied(evidence.do), "do"),
        "budgets": {n: tensors.encode(copied(c.budget), f"budgets.{n}") for n, c in evidence.tensors.items()},
        "empty_rows": evidence.promises, "lse_base": evidence.lse_base,
    }


def serving_data(case, call: dict, evidence: Evidence, tensors: TensorFile, *, device: str, title: str,
                 versions: dict) -> dict:
    """The ``CASE`` of a serving case's script: the packed or paged tensors and the form's keywords as the kernel
    received them, and the budgets in the form's output layout, their bits in ``tensors``."""
    physical = case.physical("cpu")  # the same bits and strides on any device, the poison around them included
    keywords = {n: tensors.encode(v, f"form.{n}") if isinstance(v, torch.Tensor) else v
                for n, v in physical.kwargs.items()}
    out, lse = case.output_shapes()
    return {
        **script_frame(call, evidence, describe=case.describe(), device=device, title=title, versions=versions),
        **_attention(case), "shapes": {"out": list(out), "lse": list(lse)},
        "inputs": {n: tensors.encode(t, f"inputs.{n}") for n, t in zip("qkv", physical.tensors)},
        "kwargs": _kwargs(case, tensors.encode), "per_sequence": _per_sequence(case.variant),
        "form": {"form": case.form, "keywords": keywords, **{key: call[key] for key in forms.SCRIPT_KEYS}},
        "budgets": {n: tensors.encode(copied(c.budget), f"budgets.{n}") for n, c in evidence.tensors.items()},
        "empty_rows": evidence.promises, "lse_base": evidence.lse_base, "indices": forms.form(case.form).indices,
    }


def with_tensor_file(data: dict, tensors: TensorFile) -> bytes:
    """The tensors file's content, its name and SHA-256 recorded in ``data`` (the script checks both)."""
    content = tensors.content()
    data.update(tensors_file=TensorFile.NAME, tensors_sha256=hashlib.sha256(content).hexdigest())
    return content


def _top_functions(text: str, prefixes: tuple) -> list[tuple[int, int, str]]:
    """(first line, last line, name) of the top-level functions of ``text`` named with one of ``prefixes``."""
    return [(node.lineno, node.end_lineno, node.name) for node in ast.parse(text).body
            if isinstance(node, ast.FunctionDef) and node.name.startswith(prefixes)]


def _without(text: str, prefixes: tuple) -> str:
    lines = text.splitlines(keepends=True)
    for first, last, _ in reversed(_top_functions(text, prefixes)):
        del lines[first - 1:last + 2]  # the function and the two blank lines after it
    return "".join(lines)


def _functions(text: str, prefixes: tuple) -> str:
    lines = text.splitlines(keepends=True)
    return "\n\n".join("".join(lines[first - 1:last]) for first, last, _ in _top_functions(text, prefixes))


def _with_variant(text: str, variant, kind: str) -> str:
    """``text`` with the variant's section in place of the ``@VARIANT@`` line, or without the section (a merge's)."""
    if variant is not None:
        return text.replace(_VARIANT_LINE, _variant_code(variant, kind), 1)
    start, end = text.index(_VARIANT_START), text.index(_VARIANT_LINE) + len(_VARIANT_LINE)
    return text[:start] + text[end:].lstrip("\n")


def script_text(data: dict, *, form: str = "dense", variant=None) -> str:
    """The reproducer for ``data`` (:func:`script_data`, :func:`serving_data`, or a merge's) of a case with
    ``variant`` (None: a merge's), checked to compile."""
    text = _without((_HERE / "_script.py").read_text(encoding="utf-8"), _LEFT_OUT[form])
    kind = data["kernel"]["kind"]
    call = "CALL = plain_call" if form == "dense" else "CALL = plain_kernel"
    if kind != "plain":
        calls = (_HERE / "_script_calls.py").read_text(encoding="utf-8").split(_CALLS_START, 1)[1]
        text = _without(text, ("plain_",))
        shared = f"{inspect.getsource(flex_sink_key)}\n\n" if kind == "flex" else ""  # the adapter's own
        call = f"{shared}{_functions(calls, (kind + '_',))}\n\nCALL = {kind}_call"
    part = (_HERE / f"_script_{form}.py").read_text(encoding="utf-8").split(_FORM_START, 1)[1].strip("\n")
    copies = "".join(f"{inspect.getsource(fn)}\n\n" for fn in _SHARED.get(form, ()))  # flashcheck's own
    title = data["title"].replace("\\", "/").replace('"""', "'''")
    text = text.replace("@TITLE@", title, 1).replace(_CALL_LINE, call, 1).replace(_FORM_LINE, copies + part, 1)
    text = _with_variant(text, variant, kind)
    text = text.replace(_CASE_LINE, "CASE = " + pprint.pformat(data, width=116, sort_dicts=False), 1)
    compile(text, "repro.py", "exec")  # a template edit that breaks the script fails here, not at the user's
    return text
