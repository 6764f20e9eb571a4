"""The reproducer's text: the script template (:mod:`flashcheck.repro._script`, a real module, so that it is linted
and its functions can be tested) with the case's data in place of ``CASE`` and the kernel's call in place of
``CALL``: for a built-in, the functions of :mod:`flashcheck.repro._script_calls` its call needs, copied in."""

from __future__ import annotations

import ast
import importlib.metadata
import inspect
import platform
import pprint
import sys
from pathlib import Path

import torch

from ..kernels.flex import flex_sink_key
from ._script import package_version
from .arrays import encode_tensor
from .evidence import Evidence

__all__ = ["script_data", "script_text", "generated_versions"]

_HERE = Path(__file__).resolve().parent
_CASE_LINE = "CASE: dict = {}  # @CASE@"
_CALL_LINE = "CALL = plain_call  # @CALL@"
_CALLS_START = "\n# ---- calls ----\n"  # on a line of its own (the docstring names it too)


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


def _kwargs(case) -> dict:
    """The variant's keyword arguments as data: tensors as bits, the cap as float.hex, the window as a list."""
    out = {}
    for name, value in case.variant.kwargs("cpu").items():
        if isinstance(value, torch.Tensor):
            out[name] = encode_tensor(value)
        elif name == "softcap":
            out[name] = float(value).hex()
        else:
            out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _copy(t: torch.Tensor) -> torch.Tensor:
    # A fresh contiguous CPU tensor: its storage is exactly its elements.
    return t.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def script_data(case, call: dict, evidence: Evidence, *, device: str, title: str, versions: dict) -> dict:
    """The script's ``CASE``: the inputs as the kernel received them, the budgets, and what to print."""
    q, k, v, mask = case.to_device("cpu")  # the case's layout: the same bits and strides on any device
    s = case.shapes
    return {
        "title": title, "kernel": call, "device": torch.device(device).type, "byteorder": sys.byteorder,
        "describe": case.describe() + (f", dO {case.provenance.get('upstream')}" if evidence.backward else ""),
        "diagnosis": evidence.diagnosis, "scale": case.scale.hex(), "causal": case.causal,
        "alibi": case.variant.alibi, "bias_order": case.variant.bias_order,
        "shapes": {"out": [s.batch, s.heads_q, s.n_q, s.head_dim_v]},
        "inputs": {name: encode_tensor(t) for name, t in zip(("q", "k", "v", "attn_mask"), (q, k, v, mask))},
        "kwargs": _kwargs(case), "backward": evidence.backward,
        "do": None if evidence.do is None else encode_tensor(_copy(evidence.do)),
        "budgets": {name: encode_tensor(_copy(c.budget)) for name, c in evidence.tensors.items()},
        "empty_rows": evidence.promises, "lse_base": evidence.lse_base, "generated": versions,
    }


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


def script_text(data: dict) -> str:
    """The reproducer for ``data`` (:func:`script_data`), checked to compile."""
    text = (_HERE / "_script.py").read_text(encoding="utf-8")
    kind = data["kernel"]["kind"]
    call = "CALL = plain_call"
    if kind != "plain":
        calls = (_HERE / "_script_calls.py").read_text(encoding="utf-8").split(_CALLS_START, 1)[1]
        text = _without(text, ("plain_",))
        shared = f"{inspect.getsource(flex_sink_key)}\n\n" if kind == "flex" else ""  # the adapter's own
        call = f"{shared}{_functions(calls, (kind + '_',))}\n\nCALL = {kind}_call"
    title = data["title"].replace("\\", "/").replace('"""', "'''")
    text = text.replace("@TITLE@", title, 1).replace(_CALL_LINE, call, 1)
    text = text.replace(_CASE_LINE, "CASE = " + pprint.pformat(data, width=116, sort_dicts=False), 1)
    compile(text, "repro.py", "exec")  # a template edit that breaks the script fails here, not at the user's
    return text
