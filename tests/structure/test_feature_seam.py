"""Each feature, form and quantized format lives on the seam: the source files outside ``kernels/`` (the
implementations under test) whose code names one are few, and the test lists them.

"Names" means the code, read with ast: an identifier, an attribute, a keyword or a string constant whose words
(split at anything but a letter or digit) include one of the feature's words. Docstrings and comments are prose
and do not count; a command-line flag (a string starting with ``--``) is the CLI's name, not the feature's.
"""

from __future__ import annotations

import ast
import re

import pytest

from flashcheck.contract.features import MODULES
from flashcheck.contract.forms import MODULES as FORM_MODULES

from ._imports import PACKAGE, modules

# feature -> the words that name it in code (its keyword, its spec flag, its gradient's name)
WORDS = {
    "softcap": ("softcap",),  # one entry per feature of flashcheck.contract.features (test below)
    "alibi_slopes": ("alibi",),
    "attn_bias": ("attn_bias",),
    "window": ("window",),
    "chunk": ("chunk",),
    "indices": ("key_sets", "keysets"),  # its keyword "indices" is also a plain word for positions
    "block_lists": ("block_lists", "block_sparse", "blocklists", "blocksparse"),
    "sinks": ("sinks", "dsinks"),
}
# The calling forms and the quantized inputs -> the words that name each in code, and its own module.
FORMS = {
    "varlen": (("varlen", "cu_seqlens"), "features/varlen.py"),
    "paged": (("paged", "block_table", "page_size", "page_sizes"), "features/paged.py"),
    "split_kv": (("split_kv", "num_splits"), "features/split_kv.py"),
    "mla": (("mla", "kv_lora_rank", "rope_dim"), "features/mla.py"),
    "fp8": (("fp8", "float8", "e4m3", "e5m2", "e4m3fn", "descale", "descales"), "inputs/quantization.py"),
}
WORDS.update({name: words for name, (words, _) in FORMS.items()})
# The most files each may be named in: its module, the Variant record, the torch-free table of names and spec
# flags (contract/features.py), and one more (the window: the mask library's sliding_window).
LIMIT = {name: 4 for name in WORDS}
# The block lists' Variant field has its name (the index sets' is "indices", a plain word), and their convention has
# a record module in contract/ (as MLA's) and public names in the facade: one file more.
LIMIT["block_lists"] = 5
# Quantized inputs have, besides the drawing of their scales (inputs/quantization.py), the record of the schemes a
# spec names (contract/quantization.py), the module of a case's scales the Variant holds (features/quantized.py) and
# the formats' casts emulated in float64 (numerics/quantizers.py).
LIMIT["fp8"] = 7
HOME = {**{name: f"features/{module}.py" for name, module in MODULES.items()},
        **{name: home for name, (_, home) in FORMS.items()}}


def _docstrings(tree) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def names_in(source: str) -> set[str]:
    """The words of ``source``'s code (see the module's docstring), lower-cased, with snake_case joins kept
    (``attn_bias`` is one word and also ``attn`` and ``bias``)."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            texts.append(node.arg)
        elif isinstance(node, ast.arg):
            texts.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)):
            texts.append(node.name)
        elif isinstance(node, ast.alias):
            texts += [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts.append(node.module or "")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if not node.value.startswith("--"):
                texts.append(node.value)
    words = set()
    for text in texts:
        for run in re.findall(r"[A-Za-z0-9_]+", text.lower()):
            words.add(run)
            words.update(p for p in run.split("_") if p)
    return words


def files_naming() -> dict[str, list[str]]:
    out = {f: [] for f in WORDS}
    for name, path in sorted(modules().items()):
        if name.split(".")[0] == "kernels":
            continue
        words = names_in(path.read_text())
        for feature, own in WORDS.items():
            if any(w in words for w in own):
                out[feature].append(str(path.relative_to(PACKAGE)))
    return out


FILES = files_naming()


@pytest.mark.parametrize("feature", sorted(WORDS))
def test_a_feature_is_named_in_few_files(feature):
    found = FILES[feature]
    assert HOME[feature] in found, f"the counter no longer sees {feature}'s own module, {HOME[feature]}"
    assert len(found) <= LIMIT[feature], (
        f"{feature} is named in {len(found)} files, at most {LIMIT[feature]} allowed: {found}. Reach it through "
        "flashcheck.features (its record in the registry, or the Variant's terms) instead of by name.")


def test_the_counter_sees_code_and_not_prose():
    source = ('"""softcap in a docstring"""\nfrom .chunk import X\nx = variant.sinks  # window\n'
              'y = {"attn_bias": 1}\nz = f(alibi_mode=1)\n')
    words = names_in(source)
    assert {"sinks", "attn_bias", "alibi", "chunk"} <= words
    assert "softcap" not in words and "window" not in words


def test_every_feature_and_form_is_counted():
    assert tuple(WORDS)[:len(MODULES)] == tuple(MODULES)
    assert set(FORM_MODULES) <= set(FORMS)
