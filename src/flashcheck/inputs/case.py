"""One input of the kernel calling convention, with its memory layout and where it came from.

An :class:`AttentionCase` keeps its numbers contiguous on the CPU and applies its :class:`Layout`
only when it is materialised on a device (:meth:`AttentionCase.to_device`), so the same numbers can be
handed to a kernel contiguous, transposed, strided, with stride-0 heads or at a storage offset, and
optionally inside NaN guard bands that expose out-of-bounds reads.

Saved cases are one ``.npz`` (exact bits; bf16 as raw uint16) plus one small ``.json`` (everything
else). Both are written atomically and the JSON records the ``.npz``'s SHA-256, so a crash or a stray
file never passes for a valid case.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.metadata
import json
import math
import os
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..contract import masks
from ..contract.counts import check_count
from ..contract.formats import FORMATS, format_of
from ..contract.validation import Shapes, check_attention_inputs
from ..errors import CaseFormatError, InvalidArgument

__all__ = ["AttentionCase", "Layout", "layouts", "FORMAT_VERSION", "case_paths"]

FORMAT_VERSION = 1
_FORMAT_NAME = "flashcheck-case"

_LAYOUT_NAMES = ("contiguous", "transposed", "strided", "expanded", "offset")
_TENSORS = ("q", "k", "v")

# Raw integer views used to move bits without ever doing float arithmetic (keeps NaN payloads, -0.0).
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
# How each dtype's bits are stored in the .npz.
_NPZ_DTYPE = {"fp16": np.dtype(np.float16), "bf16": np.dtype(np.uint16), "fp32": np.dtype(np.float32)}


def layouts() -> tuple[str, ...]:
    """Names of the memory layouts a case can be materialised in."""
    return _LAYOUT_NAMES


@dataclass(frozen=True)
class Layout:
    """How q, k and v sit in memory when handed to the kernel.

    - ``contiguous``: plain row-major (B, H, N, D).
    - ``transposed``: stored as (B, N, H, D), viewed as (B, H, N, D).
    - ``strided``: a slice of a larger (B, H, N + pad_n, D + pad_d) buffer; the gaps hold NaN.
    - ``expanded``: stride-0 heads (one head stored, viewed H times); only for tensors whose heads
      are bit-identical.
    - ``offset``: a 1-d buffer viewed from ``storage_offset`` elements in; the prefix holds NaN.

    ``tensors`` names which of q, k, v get the layout; the others stay contiguous.
    """

    name: str = "contiguous"
    tensors: tuple = _TENSORS
    pad_n: int = 0
    pad_d: int = 0
    storage_offset: int = 0

    def __post_init__(self):
        if self.name not in _LAYOUT_NAMES:
            raise InvalidArgument("layout", self.name, "unknown layout",
                                  f"Use one of {list(_LAYOUT_NAMES)}.")
        tensors = (self.tensors,) if isinstance(self.tensors, str) else tuple(self.tensors)
        if not tensors or any(t not in _TENSORS for t in tensors):
            raise InvalidArgument("tensors", self.tensors, "expected a non-empty subset of ('q', 'k', 'v')",
                                  "Pass e.g. tensors=('k', 'v').")
        object.__setattr__(self, "tensors", tuple(t for t in _TENSORS if t in tensors))
        for arg in ("pad_n", "pad_d", "storage_offset"):
            object.__setattr__(self, arg, check_count(arg, getattr(self, arg), minimum=0))
        # Parameters of another layout would be silently ignored; refuse them instead.
        if self.name != "strided" and (self.pad_n or self.pad_d):
            raise InvalidArgument("pad_n" if self.pad_n else "pad_d", self.pad_n or self.pad_d,
                                  f"padding applies to the strided layout, not {self.name!r}",
                                  "Use Layout.strided(pad_n=..., pad_d=...).")
        if self.name == "strided" and not (self.pad_n or self.pad_d):
            raise InvalidArgument("pad_d", self.pad_d, "a strided layout with no padding is contiguous",
                                  "Pass pad_n >= 1 and/or pad_d >= 1, or use 'contiguous'.")
        if self.name != "offset" and self.storage_offset:
            raise InvalidArgument("storage_offset", self.storage_offset,
                                  f"a storage offset applies to the offset layout, not {self.name!r}",
                                  "Use Layout.offset(elements=...).")
        if self.name == "offset" and not self.storage_offset:
            raise InvalidArgument("storage_offset", self.storage_offset, "an offset layout needs an offset",
                                  "Pass storage_offset >= 1.")

    # Named constructors, with defaults that keep 16-byte alignment of rows and bases for fp16/bf16
    # (kernels may legitimately require it); pass odd numbers to test misalignment on purpose.
    @classmethod
    def contiguous(cls) -> "Layout":
        return cls("contiguous")

    @classmethod
    def transposed(cls, *, tensors=_TENSORS) -> "Layout":
        return cls("transposed", tensors=tensors)

    @classmethod
    def strided(cls, *, pad_n: int = 3, pad_d: int = 8, tensors=_TENSORS) -> "Layout":
        return cls("strided", tensors=tensors, pad_n=pad_n, pad_d=pad_d)

    @classmethod
    def expanded(cls, *, tensors=("k", "v")) -> "Layout":
        return cls("expanded", tensors=tensors)

    @classmethod
    def offset(cls, *, elements: int = 8, tensors=_TENSORS) -> "Layout":
        return cls("offset", tensors=tensors, storage_offset=elements)

    @classmethod
    def parse(cls, value, *, argument: str = "layout") -> "Layout":
        """A Layout from a Layout, a name (default parameters) or a dict as written by :meth:`as_dict`."""
        if isinstance(value, Layout):
            return value
        if isinstance(value, str):
            if value not in _LAYOUT_NAMES:
                raise InvalidArgument(argument, value, "unknown layout", f"Use one of {list(_LAYOUT_NAMES)}.")
            return getattr(cls, value)()
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown or "name" not in value:
                raise InvalidArgument(argument, value,
                                      f"unknown keys {unknown}" if unknown else "no 'name' key",
                                      f"A layout dict has 'name' and optionally {sorted(known - {'name'})}.")
            return cls(**value)
        raise InvalidArgument(argument, value, "expected a layout name, dict or flashcheck Layout",
                              f"Pass one of {list(_LAYOUT_NAMES)} or Layout.strided(...) etc.")

    def as_dict(self) -> dict:
        out: dict = {"name": self.name, "tensors": list(self.tensors)}
        if self.name == "strided":
            out.update(pad_n=self.pad_n, pad_d=self.pad_d)
        if self.name == "offset":
            out["storage_offset"] = self.storage_offset
        return out

    def __str__(self) -> str:
        params = []
        if self.name == "strided":
            params += [f"pad_n={self.pad_n}", f"pad_d={self.pad_d}"]
        if self.name == "offset":
            params.append(f"storage_offset={self.storage_offset}")
        default = ("k", "v") if self.name == "expanded" else _TENSORS
        if self.tensors != default:
            params.append("tensors=" + "".join(self.tensors))
        return self.name + (f"({','.join(params)})" if params else "")

    def applies_to(self, tensor: str) -> bool:
        return tensor in self.tensors


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The raw integer view of a float tensor (any strides): compares and copies bit patterns."""
    return t.view(_INT_VIEW[t.dtype]) if t.dtype in _INT_VIEW else t


def _heads_identical(t: torch.Tensor) -> bool:
    bits = _bits(t)
    return bool((bits == bits[:, :1]).all())


@functools.lru_cache(maxsize=1)
def _installed_versions() -> tuple:
    # Reading package metadata costs ~1 ms a package: once a process, not once a case.
    def version(dist: str):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    # Metadata only: importing triton here would fix TRITON_INTERPRET before the user sets it.
    return (("flashcheck", version("flashcheck")), ("torch", torch.__version__), ("numpy", np.__version__),
            ("triton", version("triton")))


def _versions() -> dict:
    return dict(_installed_versions())


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (Path, torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _provenance(value) -> dict:
    if value is None:
        value = {}
    if not isinstance(value, dict) or any(not isinstance(key, str) for key in value):
        raise InvalidArgument("provenance", value, "expected a dict with string keys",
                              "Pass e.g. {'seed': 3, 'strategy': 'huge_logits', 'kernel': 'torch:math'}.")
    try:
        # A JSON round trip now makes what is saved exactly what the case holds.
        plain = json.loads(json.dumps(value, default=_jsonable, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidArgument("provenance", value, f"not JSON serialisable ({exc})",
                              "Use str/int/float/bool/None, lists and dicts only (finite floats).") from None
    out = {"seed": None, "strategy": None, "kernel": None, "notes": ""}
    out.update(plain)
    if not isinstance(out.get("versions"), dict):
        out["versions"] = _versions()
    return out


def _stored(t: torch.Tensor) -> torch.Tensor:
    # Always a fresh contiguous CPU copy: the case must not change when the caller's tensor does.
    return t.detach().to("cpu").clone(memory_format=torch.contiguous_format)


def _plan(shape: tuple, layout: Layout, applies: bool):
    """(storage extent, storage offset, strides, write-source slice) of one tensor in a layout."""
    B, H, N, D = shape
    contiguous = (H * N * D, N * D, D, 1)
    name = layout.name if applies else "contiguous"
    if name == "transposed":
        return B * H * N * D, 0, (N * H * D, D, H * D, 1), None
    if name == "strided":
        Np, Dp = N + layout.pad_n, D + layout.pad_d
        return B * H * Np * Dp, 0, (H * Np * Dp, Np * Dp, Dp, 1), None
    if name == "expanded":
        # One head stored per batch entry; the write goes through head 0 only.
        return B * N * D, 0, (N * D, 0, D, 1), slice(0, 1)
    if name == "offset":
        return layout.storage_offset + B * H * N * D, layout.storage_offset, contiguous, None
    return B * H * N * D, 0, contiguous, None


def _guard_size(guard_bands, shape: tuple) -> int:
    if guard_bands is False:
        return 0
    if guard_bands is True:
        # Wide enough that a kernel overrunning by a whole 128-row tile still lands in NaN.
        return max(1024, 128 * shape[-1])
    return check_count("guard_bands", guard_bands, minimum=0)


def _materialise(t: torch.Tensor, layout: Layout, applies: bool, device: torch.device, guard: int):
    extent, offset, strides, head_slice = _plan(tuple(t.shape), layout, applies)
    # Everything that is not the tensor (gaps, prefix, guard bands) is NaN, so reading it shows.
    buffer = torch.full((guard + extent + guard,), float("nan"), dtype=t.dtype, device=device)
    base = guard + offset
    view = buffer.as_strided(tuple(t.shape), strides, base)
    if head_slice is None:
        _bits(view).copy_(_bits(t))
    else:
        src = t[:, head_slice]
        dst = buffer.as_strided(tuple(src.shape), (strides[0], 1, strides[2], strides[3]), base)
        _bits(dst).copy_(_bits(src))
    return view


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


def _write_temporary(path: Path, write) -> str:
    """Write a hidden temporary file next to ``path`` (same file system, so os.replace is atomic)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make shared corpora unreadable to others
    except BaseException:
        _remove(tmp)
        raise
    return tmp


def _remove(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _sha256(path) -> str:
    # Streamed: long-sequence cases reach hundreds of MB.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, eq=False)
class AttentionCase:
    """One input of the kernel calling convention (see DESIGN.md), stored contiguous on the CPU.

    Build one with :meth:`create` (or the constructor, which validates the same way).
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    scale: float
    causal: str = "none"
    attn_mask: torch.Tensor | None = None
    layout: Layout = field(default_factory=Layout.contiguous)
    provenance: dict = field(default_factory=dict)

    def __post_init__(self):
        q, k, v, scale, causal, mask, _ = check_attention_inputs(
            self.q, self.k, self.v, scale=self.scale, causal=self.causal, attn_mask=self.attn_mask)
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        put("q", _stored(q))
        put("k", _stored(k))
        put("v", _stored(v))
        put("scale", scale)
        put("causal", causal)
        put("attn_mask", None if mask is None else _stored(mask))
        put("layout", Layout.parse(self.layout))
        put("provenance", _provenance(self.provenance))
        self._check_layout(self.layout, argument="layout")

    @classmethod
    def create(cls, q, k, v, *, scale, causal="none", attn_mask=None, layout="contiguous",
               provenance=None) -> "AttentionCase":
        """Validate one input (torch tensors or numpy arrays) and keep a contiguous CPU copy of it."""
        return cls(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, layout=layout,
                   provenance=provenance)

    # ---- what the case is -------------------------------------------------------------------------

    @property
    def shapes(self) -> Shapes:
        B, Hq, Nq, D = self.q.shape
        return Shapes(B, Hq, self.k.shape[1], Nq, self.k.shape[2], D, self.v.shape[3])

    @property
    def dtype(self) -> str:
        """The dtype's name: ``"fp16"``, ``"bf16"`` or ``"fp32"``."""
        return format_of(self.q).name

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.q.dtype

    @property
    def attention_shape(self) -> tuple[int, int, int, int]:
        s = self.shapes
        return (s.batch, s.heads_q, s.n_q, s.n_k)

    def visible(self) -> torch.Tensor:
        """Bool (B, Hq, Nq, Nk): True where query i may attend key j under causal and attn_mask."""
        return masks.visible(self.causal, self.attn_mask, self.attention_shape)

    def empty_rows(self) -> torch.Tensor:
        """Bool (B, Hq, Nq): rows with no visible key (the kernel's ``fully_masked_rows`` promise)."""
        return ~self.visible().any(dim=-1)

    def applicable_layouts(self) -> tuple[str, ...]:
        """The layout names (default parameters) this case's numbers allow."""
        return tuple(name for name in _LAYOUT_NAMES
                     if name != "expanded" or self._layout_problem(Layout.expanded()) is None)

    def with_layout(self, layout) -> "AttentionCase":
        return dataclasses.replace(self, layout=layout)

    def equal_bits(self, other: "AttentionCase") -> bool:
        """Same numbers bit for bit (NaN payloads and -0.0 included), scale, causal and mask."""
        if not isinstance(other, AttentionCase):
            return False
        pairs = [(self.q, other.q), (self.k, other.k), (self.v, other.v)]
        if (self.attn_mask is None) != (other.attn_mask is None):
            return False
        if self.attn_mask is not None:
            pairs.append((self.attn_mask, other.attn_mask))
        return (self.scale.hex() == other.scale.hex() and self.causal == other.causal
                and all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(_bits(a), _bits(b))
                        for a, b in pairs))

    def describe(self) -> str:
        s = self.shapes
        mask = "none" if self.attn_mask is None else "(" + ",".join(str(n) for n in self.attn_mask.shape) + ")"
        return (f"{self.dtype} B={s.batch} Hq={s.heads_q} Hkv={s.heads_kv} Nq={s.n_q} Nk={s.n_k} "
                f"D={s.head_dim} Dv={s.head_dim_v} scale={self.scale:.6g} causal={self.causal} "
                f"mask={mask} layout={self.layout}")

    def __repr__(self) -> str:
        return f"AttentionCase({self.describe()})"

    # ---- handing it to a kernel -------------------------------------------------------------------

    def _layout_problem(self, layout: Layout) -> str | None:
        if layout.name == "expanded":
            for name in layout.tensors:
                if not _heads_identical(getattr(self, name)):
                    return f"the heads of {name} are not bit-identical, so stride-0 heads cannot hold them"
        return None

    def _check_layout(self, layout: Layout, *, argument: str) -> None:
        problem = self._layout_problem(layout)
        if problem:
            raise InvalidArgument(argument, str(layout), problem,
                                  "Use 'expanded' only for tensors whose heads are equal (draw one head and "
                                  "repeat it), pick Layout.expanded(tensors=...) accordingly, or use another "
                                  "layout.")

    def to_device(self, device="cpu", *, layout=None, guard_bands=False):
        """``(q, k, v, attn_mask)`` on ``device`` with this case's bits in the case's layout (or ``layout``).

        ``guard_bands`` (True, or a number of elements) puts each of q, k and v inside a larger buffer
        whose memory just before and just after the tensor holds NaN, so a kernel that reads out of
        bounds produces NaN; the tensors returned are views into those buffers. The mask is returned
        contiguous in its own broadcast shape.
        """
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError):
            raise InvalidArgument("device", device, "not a torch device",
                                  "Pass e.g. 'cuda', 'cuda:1' or 'cpu'.") from None
        layout = self.layout if layout is None else Layout.parse(layout)
        self._check_layout(layout, argument="layout")
        if not isinstance(guard_bands, bool):
            check_count("guard_bands", guard_bands, minimum=0)
        out = []
        for name in _TENSORS:
            t = getattr(self, name)
            out.append(_materialise(t, layout, layout.applies_to(name), device,
                                    _guard_size(guard_bands, tuple(t.shape))))
        return out[0], out[1], out[2], self._mask_on(device)

    def _mask_on(self, device) -> torch.Tensor | None:
        """A copy of the mask (a kernel writing into it must not change the case) at the start of a
        buffer of False as large as the full broadcast mask (up to 64 MB): a kernel that misreads a
        broadcast mask's strides then reads False, the same on every run, so its findings replay."""
        if self.attn_mask is None:
            return None
        mask = self.attn_mask.to(device, copy=True).contiguous()
        room = min(math.prod(self.attention_shape), 1 << 26)
        if room <= mask.numel():
            return mask
        buffer = torch.zeros(room, dtype=torch.bool, device=device)
        buffer[:mask.numel()] = mask.reshape(-1)
        return buffer[:mask.numel()].view(mask.shape)

    # ---- saving and loading -----------------------------------------------------------------------

    def _metadata(self) -> dict:
        s = self.shapes
        return {
            "format": _FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "describe": self.describe(),
            "dtype": self.dtype,
            "storage": {"q": _NPZ_DTYPE[self.dtype].name, "k": _NPZ_DTYPE[self.dtype].name,
                        "v": _NPZ_DTYPE[self.dtype].name},
            "shapes": {"q": list(self.q.shape), "k": list(self.k.shape), "v": list(self.v.shape)},
            "dims": {"B": s.batch, "Hq": s.heads_q, "Hkv": s.heads_kv, "Nq": s.n_q, "Nk": s.n_k,
                     "D": s.head_dim, "Dv": s.head_dim_v},
            "scale": self.scale,
            "scale_hex": self.scale.hex(),
            "causal": self.causal,
            "attn_mask": None if self.attn_mask is None else {"shape": list(self.attn_mask.shape)},
            "layout": self.layout.as_dict(),
            "provenance": self.provenance,
        }

    def _arrays(self) -> dict:
        def array(t: torch.Tensor) -> np.ndarray:
            if t.dtype == torch.bfloat16:
                # numpy has no bf16: store the raw bits.
                return t.view(torch.int16).numpy().view(np.uint16)
            return t.numpy()

        arrays = {"q": array(self.q), "k": array(self.k), "v": array(self.v)}
        if self.attn_mask is not None:
            arrays["attn_mask"] = self.attn_mask.numpy()
        return arrays

    def save(self, path_stem) -> tuple[Path, Path]:
        """Write ``<stem>.npz`` and ``<stem>.json`` atomically; return their paths."""
        npz_path, json_path = case_paths(path_stem)
        npz_path.parent.mkdir(parents=True, exist_ok=True)
        arrays = self._arrays()
        temporaries = []
        try:
            temporaries.append(_write_temporary(npz_path, lambda f: np.savez(f, **arrays)))
            meta = self._metadata()
            meta["npz_sha256"] = _sha256(temporaries[0])
            json_bytes = (_dumps(meta) + "\n").encode()
            temporaries.append(_write_temporary(json_path, lambda f: f.write(json_bytes)))
            # npz first, json last: the JSON records the npz's hash, so a crash in between (an old JSON
            # next to a new npz, or an npz alone) is refused at load instead of replayed as a mismatch.
            os.replace(temporaries[0], npz_path)
            os.replace(temporaries[1], json_path)
        finally:
            for tmp in temporaries:
                _remove(tmp)
        return npz_path, json_path

    @classmethod
    def load(cls, path) -> "AttentionCase":
        """Load a case saved by :meth:`save` from its ``.json``, its ``.npz`` or their stem."""
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
        meta = _check_meta(json_path, meta)
        expected_hash = meta.get("npz_sha256")
        if expected_hash is not None:
            try:
                actual_hash = _sha256(npz_path)
            except OSError as exc:
                raise CaseFormatError(npz_path, f"unreadable ({exc})", fix_resave) from None
            if actual_hash != expected_hash:
                raise CaseFormatError(npz_path, "its SHA-256 differs from the one its JSON records (the npz "
                                      "was replaced, truncated or belongs to another case)", fix_resave)
        arrays = _read_npz(npz_path)
        tensors = _check_arrays(npz_path, meta, arrays)
        try:
            return cls(tensors["q"], tensors["k"], tensors["v"], scale=meta["_scale"], causal=meta["causal"],
                       attn_mask=tensors.get("attn_mask"), layout=meta["layout"],
                       provenance=meta.get("provenance") or {})
        except InvalidArgument as exc:
            raise CaseFormatError(json_path, f"the stored case is not a valid input: {exc}", fix_resave) from None


def _check_meta(path: Path, meta) -> dict:
    fix = "Re-save the case with this flashcheck, or repair the JSON by hand."
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
    for key in ("dtype", "shapes", "causal", "layout", "scale_hex"):
        if key not in meta:
            raise CaseFormatError(path, f"missing key {key!r}", fix)
    if meta["dtype"] not in FORMATS:
        raise CaseFormatError(path, f"dtype {meta['dtype']!r} is not one of {sorted(FORMATS)}", fix)
    shapes = meta["shapes"]
    if not isinstance(shapes, dict) or any(
            not isinstance(shapes.get(n), list) or not all(isinstance(x, int) for x in shapes[n])
            for n in _TENSORS):
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
    mask = meta.get("attn_mask")
    if mask is not None and (not isinstance(mask, dict) or not isinstance(mask.get("shape"), list)):
        raise CaseFormatError(path, "'attn_mask' must be null or {\"shape\": [...]}", fix)
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


def _check_arrays(path: Path, meta: dict, arrays: dict) -> dict:
    fix = "The .npz and .json do not describe the same case; re-save it."
    names = list(_TENSORS) + (["attn_mask"] if meta.get("attn_mask") is not None else [])
    extra = sorted(set(arrays) - set(names))
    missing = [n for n in names if n not in arrays]
    if missing or extra:
        raise CaseFormatError(path, f"arrays {sorted(arrays)} found; expected {names}", fix)
    want = _NPZ_DTYPE[meta["dtype"]]
    out = {}
    for name in names:
        a = arrays[name]
        expected_shape = meta["shapes"][name] if name in _TENSORS else meta["attn_mask"]["shape"]
        expected_dtype = np.dtype(np.bool_) if name == "attn_mask" else want
        if a.dtype != expected_dtype:
            raise CaseFormatError(path, f"{name} is stored as {a.dtype}; a {meta['dtype']} case stores "
                                  f"{expected_dtype}", fix)
        if list(a.shape) != list(expected_shape):
            raise CaseFormatError(path, f"{name} has shape {list(a.shape)}; the JSON says {expected_shape}", fix)
        if meta["dtype"] == "bf16" and name != "attn_mask":
            t = torch.from_numpy(np.array(a, order="C").view(np.int16)).view(torch.bfloat16)
        else:
            # np.array, not np.ascontiguousarray: the latter turns a 0-d mask into shape (1,).
            t = torch.from_numpy(np.array(a, order="C"))
        out[name] = t
    return out
