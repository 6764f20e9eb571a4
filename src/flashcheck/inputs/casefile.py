"""The saved-case file format: one ``.npz`` (exact bits; bf16 as raw uint16) plus one small ``.json``
(everything else: shapes, dtype, layout, scale as hex, mask shape, provenance, the npz's SHA-256).

Both files are written atomically (:mod:`flashcheck.files`), the npz first and the JSON last, and the JSON
records the npz's hash, so a crash or a stray file never passes for a valid case: loading refuses it,
naming the file and what is wrong with it. The cases themselves are :mod:`flashcheck.inputs.case` and
:mod:`flashcheck.inputs.serving`, which save themselves here and build what :func:`load_saved_case` reads: this
module knows their fields, not their classes, so that both can import it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..contract.formats import FORMATS, QUANTIZED_DTYPES, format_of
from ..errors import CaseFormatError, InvalidArgument
from ..features import forms
from ..features.variant import SAVED_DTYPES
from ..features.variant import TENSORS as TENSORS_OF_VARIANTS
from ..features.variant import Variant
from ..files import remove_quietly, write_temporary
from .layout import TENSORS, Layout

__all__ = ["FORMAT_VERSION", "MERGE_FORMAT_NAME", "add_provenance", "case_paths", "load_saved_case", "loaded_tensor",
           "read_case_files", "save_case", "saved_format", "stored_array", "write_case_files"]

FORMAT_VERSION = 5
# Version 2 adds the case's variant (its scalar features and settings in the JSON, its tensor features in the npz,
# in the Variant's order). A case without one is written as version 1, which every flashcheck reads.
# Version 3 adds the serving form (lengths, page size, poison and a varlen case's seqused_k slack in the JSON;
# the block table in the npz).
# Version 4 adds fp8 inputs (their bits as uint8) and their descales (in the npz).
# Version 5 adds block scales (the scheme in the variant's JSON, each tensor's scales as fp32 in the npz).
_PLAIN_VERSION, _VARIANT_VERSION, _QUANTIZED_VERSION, _BLOCK_SCALED_VERSION = 1, 2, 4, 5
_FORMAT_NAME = "flashcheck-case"
MERGE_FORMAT_NAME = "flashcheck-merge-case"  # the states of a merge (:mod:`flashcheck.inputs.merge_case`)
# How each dtype's bits are stored in the .npz.
_NPZ_DTYPE = {"fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16), "fp32": np.dtype(np.float32),
              **{name: np.dtype(np.uint8) for name in QUANTIZED_DTYPES},
              "bool": np.dtype(np.bool_), "int32": np.dtype(np.int32)}
_RAW = {torch.bfloat16: (torch.int16, np.uint16),
        **{FORMATS[name].dtype: (torch.uint8, np.uint8) for name in QUANTIZED_DTYPES}}  # numpy has none of these
# Arrays beside q, k and v, each present when the JSON gives its shape, and their dtypes (None: the one the
# JSON gives with the shape; q, k and v are in the case's dtype): the mask, the variant's tensors (each feature's
# saved_dtype; a quantized case's descales) and a serving form's arrays (flashcheck.features.forms.ARRAYS).
_VARIANT_ARRAYS = dict(SAVED_DTYPES)
assert tuple(_VARIANT_ARRAYS) == TENSORS_OF_VARIANTS, (tuple(_VARIANT_ARRAYS), TENSORS_OF_VARIANTS)
_EXTRA_ARRAYS = {"attn_mask": "bool", **_VARIANT_ARRAYS, **forms.ARRAYS}
# The JSON's "form" of a serving case: ServingCase's fields besides its base and arrays, each form's in the
# forms' order; k_slack (a case that passes seqused_k) only where it has one, so that other cases are written as
# before it.
_FORM_KEYS = ("form", "q_lens", "k_lens", *forms.JSON_KEYS, "poison")
_OPTIONAL_FORM_KEYS = ("k_slack",)


def case_paths(path) -> tuple[Path, Path]:
    """``(npz_path, json_path)`` of a saved case given its ``.json``, its ``.npz`` or their stem."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgument("path", path, "expected a file path",
                              "Pass the case's .json, .npz or their common stem as a str or Path.")
    text = os.fspath(path)
    # Strip only our own suffixes: stems often contain dots (case.fp16.seed3).
    for suffix in (".json", ".npz"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
            break
    return Path(text + ".npz"), Path(text + ".json")


# A JSON list of plain tokens (numbers, identifiers): safe to put on one line since no token holds a comma.
_TOKEN = r'(?:-?\d[\d.eE+-]*|"\w*"|null|true|false)'
_FLAT_LIST = re.compile(r"\[\s*(" + _TOKEN + r"(?:\s*,\s*" + _TOKEN + r")*)\s*\]")


def _dumps(meta: dict) -> str:
    """Indented JSON with short lists (shapes, tensor names) kept on one line, for people reading it."""
    text = json.dumps(meta, indent=2, allow_nan=False)
    return _FLAT_LIST.sub(lambda m: "[" + ", ".join(x.strip() for x in m.group(1).split(",")) + "]", text)


def _sha256(path) -> str:
    # Streamed: long-sequence cases reach hundreds of MB.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _metadata(case, serving) -> dict:
    meta = _dense_metadata(case)
    if serving is None:
        return meta
    table = {name: {"shape": list(getattr(serving, name).shape)} for name in forms.ARRAYS
             if getattr(serving, name) is not None}
    # Serving cases were written as version 4 before block scales: kept, so their bytes stay the same.
    version = max(_QUANTIZED_VERSION, _version(case.variant))
    return {**meta, "format_version": version, "describe": serving.describe(),
            "form": _form_metadata(serving), **table}


def _dense_metadata(case) -> dict:
    s = case.shapes
    return {
        "format": _FORMAT_NAME,
        "format_version": _version(case.variant),
        "describe": case.describe(),
        "dtype": case.dtype,
        "storage": {"q": _NPZ_DTYPE[case.dtype].name, "k": _NPZ_DTYPE[case.dtype].name,
                    "v": _NPZ_DTYPE[case.dtype].name},
        "shapes": {"q": list(case.q.shape), "k": list(case.k.shape), "v": list(case.v.shape)},
        "dims": {"B": s.batch, "Hq": s.heads_q, "Hkv": s.heads_kv, "Nq": s.n_q, "Nk": s.n_k,
                 "D": s.head_dim, "Dv": s.head_dim_v},
        "scale": case.scale,
        "scale_hex": case.scale.hex(),
        "causal": case.causal,
        "attn_mask": None if case.attn_mask is None else {"shape": list(case.attn_mask.shape)},
        "layout": case.layout.as_dict(),
        "provenance": case.provenance,
        **_variant_metadata(case.variant),
    }


def _form_metadata(case) -> dict:
    form = {key: getattr(case, key) for key in _FORM_KEYS}
    form.update({key: getattr(case, key) for key in _OPTIONAL_FORM_KEYS if getattr(case, key) is not None})
    return form


def _version(variant) -> int:
    if variant.quantized:
        return _BLOCK_SCALED_VERSION if variant.quantization.block_scaled else _QUANTIZED_VERSION
    return _VARIANT_VERSION if variant.used else _PLAIN_VERSION


def _variant_metadata(variant) -> dict:
    if _version(variant) == _PLAIN_VERSION:
        return {}
    out = {"variant": variant.as_dict()}
    for name in TENSORS_OF_VARIANTS:
        t = getattr(variant, name)
        if t is not None:
            out[name] = {"shape": list(t.shape)}
            if _EXTRA_ARRAYS[name] is None:
                out[name]["dtype"] = format_of(t).name
    return out


def _arrays(case, serving) -> dict:
    case = case.on("cpu")  # a case drawn on a GPU is saved from the host
    arrays = {"q": stored_array(case.q), "k": stored_array(case.k), "v": stored_array(case.v)}
    if case.attn_mask is not None:
        arrays["attn_mask"] = case.attn_mask.numpy()
    for name in TENSORS_OF_VARIANTS:
        if getattr(case.variant, name) is not None:
            arrays[name] = stored_array(getattr(case.variant, name))
    if serving is not None:
        arrays.update({name: getattr(serving, name).numpy() for name in forms.ARRAYS
                       if getattr(serving, name) is not None})
    return arrays


def stored_array(t: torch.Tensor) -> np.ndarray:
    """``t`` (on the CPU) as the npz stores it: bf16 and fp8 as the integers of their bits, which numpy lacks."""
    if t.dtype in _RAW:
        bits, stored = _RAW[t.dtype]
        return t.view(bits).numpy().view(stored)
    return t.numpy()


def loaded_tensor(a: np.ndarray, dtype) -> torch.Tensor:
    """The tensor of torch dtype ``dtype`` (None: the array's own) that :func:`stored_array` stored as ``a``."""
    if dtype in _RAW:
        return _from_bits(a, dtype)
    # np.array, not np.ascontiguousarray: the latter turns a 0-d mask into shape (1,).
    return torch.from_numpy(np.array(a, order="C"))


def save_case(case, path_stem, *, serving=None) -> tuple[Path, Path]:
    """Write the dense ``case`` (with ``serving``, the serving-form case over it as its base, when it is one) as
    ``<stem>.npz`` and ``<stem>.json`` atomically; return their paths."""
    return write_case_files(path_stem, _arrays(case, serving), lambda: _metadata(case, serving))


def write_case_files(path_stem, arrays: dict, metadata) -> tuple[Path, Path]:
    """Write ``arrays`` as ``<stem>.npz`` and ``metadata()`` (a dict; the npz's hash is added) as ``<stem>.json``,
    atomically; return their paths."""
    npz_path, json_path = case_paths(path_stem)
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    temporaries = []
    try:
        temporaries.append(write_temporary(npz_path, lambda f: np.savez(f, **arrays)))
        meta = metadata()
        meta["npz_sha256"] = _sha256(temporaries[0])
        json_bytes = (_dumps(meta) + "\n").encode()
        temporaries.append(write_temporary(json_path, lambda f: f.write(json_bytes)))
        # npz first, json last: the JSON records the npz's hash, so a crash in between (an old JSON
        # next to a new npz, or an npz alone) is refused at load instead of replayed as a mismatch.
        os.replace(temporaries[0], npz_path)
        os.replace(temporaries[1], json_path)
    finally:
        for tmp in temporaries:
            remove_quietly(tmp)
    return npz_path, json_path


def add_provenance(path, **values) -> None:
    """Add ``values`` to the provenance of the case saved at ``path`` (its ``.json``, ``.npz`` or stem): its JSON
    rewritten atomically, the npz (and the hash the JSON keeps of it) as they were."""
    _, json_path = case_paths(path)
    meta = json.loads(json_path.read_text(encoding="utf-8"))
    meta["provenance"] = {**(meta.get("provenance") or {}), **values}
    json_bytes = (_dumps(meta) + "\n").encode()
    tmp = write_temporary(json_path, lambda f: f.write(json_bytes))
    try:
        os.replace(tmp, json_path)
    finally:
        remove_quietly(tmp)


def load_saved_case(path, build):
    """The case saved at ``path`` (its ``.json``, its ``.npz`` or their stem), checked and handed to ``build(fields,
    form)``: ``fields`` the dense case's constructor keywords, ``form`` a serving case's besides its base (None for
    a dense case). A case ``build`` refuses (InvalidArgument, TypeError) is a :class:`CaseFormatError`."""
    meta, arrays = read_case_files(path, _check_meta)
    npz_path, json_path = case_paths(path)
    tensors = _check_arrays(npz_path, meta, arrays)
    try:
        return build(_dense_fields(meta, tensors), _serving_fields(meta, tensors))
    except (InvalidArgument, TypeError) as exc:
        raise CaseFormatError(json_path, f"the stored case is not a valid input: {exc}",
                              "Re-save the case, or delete this pair of files.") from None


def _dense_fields(meta: dict, tensors: dict) -> dict:
    return {"q": tensors["q"], "k": tensors["k"], "v": tensors["v"], "scale": meta["_scale"], "causal": meta["causal"],
            "attn_mask": tensors.get("attn_mask"), "layout": meta["layout"],
            "provenance": meta.get("provenance") or {}, "variant": Variant.from_dict(meta.get("variant"), tensors)}


def _serving_fields(meta: dict, tensors: dict) -> dict | None:
    form = meta.get("form")
    return None if form is None else {**form, **{name: tensors.get(name) for name in forms.ARRAYS}}


def read_case_files(path, check_meta) -> tuple[dict, dict]:
    """(metadata, arrays) of a saved pair of files given its ``.json``, ``.npz`` or stem: the JSON checked by
    ``check_meta(json_path, meta)`` (which returns it), the npz against the hash the JSON records."""
    npz_path, json_path = case_paths(path)
    fix_resave = "Re-save the case, or delete this pair of files."
    for p in (json_path, npz_path):
        if not p.is_file():
            raise CaseFormatError(p, "file not found",
                                  "A saved case is a .json and a .npz with the same stem; both are needed.")
    try:
        meta = json.loads(json_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CaseFormatError(json_path, f"unreadable JSON ({exc})", fix_resave) from None
    meta = check_meta(json_path, meta)
    expected_hash = meta.get("npz_sha256")
    if expected_hash is not None:
        try:
            actual_hash = _sha256(npz_path)
        except OSError as exc:
            raise CaseFormatError(npz_path, f"unreadable ({exc})", fix_resave) from None
        if actual_hash != expected_hash:
            raise CaseFormatError(npz_path, "its SHA-256 differs from the one its JSON records (the npz "
                                  "was replaced, truncated or belongs to another case)", fix_resave)
    return meta, _read_npz(npz_path)


def saved_format(path) -> str | None:
    """The ``"format"`` a saved case's JSON names (None where there is no readable JSON object)."""
    try:
        meta = json.loads(case_paths(path)[1].read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return meta.get("format") if isinstance(meta, dict) else None


def _check_meta(path: Path, meta) -> dict:
    fix = "Re-save the case with this flashcheck, or repair the JSON by hand."
    if isinstance(meta, dict) and meta.get("format") == MERGE_FORMAT_NAME:
        raise CaseFormatError(path, "the states of a merge that flashcheck.check_merge saved, not an attention case",
                              "Pass it to flashcheck repro, which writes its reproducer.")
    if not isinstance(meta, dict) or meta.get("format") != _FORMAT_NAME:
        raise CaseFormatError(path, f"not a flashcheck case (no \"format\": \"{_FORMAT_NAME}\")", fix)
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise CaseFormatError(path, f"format_version={version!r} is not an integer", fix)
    if version > FORMAT_VERSION:
        raise CaseFormatError(path, f"format_version {version} is newer than this flashcheck's "
                              f"{FORMAT_VERSION}", "Upgrade flashcheck to replay this case.")
    if version < 1:
        raise CaseFormatError(path, f"format_version {version} is not a known version", fix)
    form = meta.get("form")
    if form is not None and (not isinstance(form, dict) or not set(_FORM_KEYS) <= set(form)
                             or not set(form) <= set(_FORM_KEYS + _OPTIONAL_FORM_KEYS)):
        raise CaseFormatError(path, f"'form' must be null or a dict of {list(_FORM_KEYS)} (and optionally "
                              f"{list(_OPTIONAL_FORM_KEYS)})", fix)
    for key in ("dtype", "shapes", "causal", "layout", "scale_hex"):
        if key not in meta:
            raise CaseFormatError(path, f"missing key {key!r}", fix)
    if meta["dtype"] not in FORMATS:
        raise CaseFormatError(path, f"dtype {meta['dtype']!r} is not one of {sorted(FORMATS)}", fix)
    shapes = meta["shapes"]
    if not isinstance(shapes, dict) or any(
            not isinstance(shapes.get(n), list) or not all(isinstance(x, int) for x in shapes[n])
            for n in TENSORS):
        raise CaseFormatError(path, "'shapes' must map q, k and v to lists of ints", fix)
    try:
        scale = float.fromhex(meta["scale_hex"])
    except (TypeError, ValueError):
        raise CaseFormatError(path, f"scale_hex={meta['scale_hex']!r} is not a float.hex() string", fix) from None
    # The hex is authoritative; a decimal 'scale' that disagrees means a hand edit that would be ignored.
    if "scale" in meta and not (isinstance(meta["scale"], (int, float)) and float(meta["scale"]) == scale):
        raise CaseFormatError(path, f"scale={meta['scale']!r} disagrees with scale_hex={meta['scale_hex']!r} "
                              f"({scale!r})", "Edit scale_hex (the exact value) and scale together.")
    if not math.isfinite(scale):
        raise CaseFormatError(path, f"scale {scale!r} is not finite", fix)
    for key, dtype in _EXTRA_ARRAYS.items():
        value = meta.get(key)
        if value is not None and (not isinstance(value, dict) or not isinstance(value.get("shape"), list)):
            raise CaseFormatError(path, f"'{key}' must be null or {{\"shape\": [...]}}", fix)
        if value is not None and dtype is None and value.get("dtype") not in FORMATS:
            raise CaseFormatError(path, f"'{key}' has dtype {value.get('dtype')!r}, not one of {sorted(FORMATS)}", fix)
    try:
        Variant.from_dict(meta.get("variant"))
    except InvalidArgument as exc:
        raise CaseFormatError(path, f"bad variant: {exc}", fix) from None
    try:
        Layout.parse(meta["layout"])
    except InvalidArgument as exc:
        raise CaseFormatError(path, f"bad layout: {exc}", fix) from None
    return dict(meta, _scale=scale)


def _read_npz(path: Path) -> dict:
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise CaseFormatError(path, f"corrupt npz ({type(exc).__name__}: {exc})",
                              "Re-save the case, or delete this pair of files.") from None


def _from_bits(a: np.ndarray, dtype) -> torch.Tensor:
    bits = {torch.int16: np.int16, torch.uint8: np.uint8}[_RAW[dtype][0]]
    return torch.from_numpy(np.array(a, order="C").view(bits)).view(dtype)


def _check_arrays(path: Path, meta: dict, arrays: dict) -> dict:
    fix = "The .npz and .json do not describe the same case; re-save it."
    names = list(TENSORS) + [n for n in _EXTRA_ARRAYS if meta.get(n) is not None]
    extra = sorted(set(arrays) - set(names))
    missing = [n for n in names if n not in arrays]
    if missing or extra:
        raise CaseFormatError(path, f"arrays {sorted(arrays)} found; expected {names}", fix)
    out = {}
    for name in names:
        a = arrays[name]
        expected_shape = meta["shapes"][name] if name in TENSORS else meta[name]["shape"]
        dtype = meta["dtype"] if name in TENSORS else _EXTRA_ARRAYS[name] or meta[name]["dtype"]
        if a.dtype != _NPZ_DTYPE[dtype]:
            raise CaseFormatError(path, f"{name} is stored as {a.dtype}; a {dtype} "
                                  f"{'case' if name in TENSORS else name} stores {_NPZ_DTYPE[dtype]}", fix)
        if list(a.shape) != list(expected_shape):
            raise CaseFormatError(path, f"{name} has shape {list(a.shape)}; the JSON says {expected_shape}", fix)
        out[name] = loaded_tensor(a, FORMATS[dtype].dtype if dtype in FORMATS else None)
    return out
