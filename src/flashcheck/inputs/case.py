"""One input of the kernel calling convention, with its memory layout and where it came from.

An :class:`AttentionCase` keeps its numbers contiguous on the CPU and applies its :class:`Layout`
only when it is materialised on a device (:meth:`AttentionCase.to_device`), so the same numbers can be
handed to a kernel contiguous, transposed, strided, with stride-0 heads or at a storage offset, and
optionally inside NaN guard bands that expose out-of-bounds reads.

Saved cases are one ``.npz`` plus one ``.json``: the format is :mod:`flashcheck.inputs.casefile`. A saved case
may be a serving form's (:mod:`flashcheck.inputs.serving`), so loading one, of either kind, is here, above both.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..contract import masks
from ..contract.counts import check_count
from ..contract.formats import format_of, is_quantized, raw_bits
from ..contract.validation import Shapes, check_attention_inputs
from ..errors import InvalidArgument
from ..features.quantized import check_codes
from ..features.variant import Variant, check_shapes
from .casefile import load_saved_case, save_case
from .layout import TENSORS, Layout, guard_size, layouts, materialise
from .serving import ServingCase

__all__ = ["AttentionCase", "describe_inputs", "load_case"]

def _heads_identical(t: torch.Tensor) -> bool:
    bits = raw_bits(t)
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


def _variant(variant, shapes, tensors) -> Variant:
    if not isinstance(variant, Variant):
        raise InvalidArgument("variant", variant, "expected a flashcheck.Variant",
                              "Pass variant=flashcheck.Variant(...) with the features the case uses, or None.")
    check_shapes(variant, shapes)
    if variant.quantized:
        check_codes(tensors, variant.quantization)
    return variant


_BITS_TAG = "quantized bits"


def _as_bits(value):
    if isinstance(value, torch.Tensor) and is_quantized(value.dtype):
        return (_BITS_TAG, value.view(torch.uint8), str(value.dtype).removeprefix("torch."))
    return value


def _from_bits(value):
    if isinstance(value, tuple) and len(value) == 3 and value[0] == _BITS_TAG:
        return value[1].view(getattr(torch, value[2]))
    return value


def _stored(t: torch.Tensor) -> torch.Tensor:
    # Always a fresh contiguous copy, on the tensor's own device: the case must not change when the caller's
    # tensor does, and a case drawn on a GPU is judged there without a round trip through the host.
    return t.detach().clone(memory_format=torch.contiguous_format)


def describe_inputs(q, k, v, *, scale: float, causal: str, attn_mask=None, variant: Variant | None = None,
                    layout=None) -> str:
    """One attention call in a line, as cases and verdicts name it: ``fp16 B=1 Hq=2 ... causal=none mask=none``
    (``layout=`` when known, then the variant's parameters)."""
    (batch, heads_q, n_q, d), (heads_kv, n_k), dv = q.shape, k.shape[1:3], v.shape[3]
    mask = "none" if attn_mask is None else "(" + ",".join(str(n) for n in attn_mask.shape) + ")"
    where = "" if layout is None else f" layout={layout}"
    extra = "" if variant is None else variant.describe()
    return (f"{format_of(q).name} B={batch} Hq={heads_q} Hkv={heads_kv} Nq={n_q} Nk={n_k} D={d} Dv={dv} "
            f"scale={scale:.6g} causal={causal} mask={mask}{where}" + (f" {extra}" if extra else ""))


@dataclass(frozen=True, eq=False)
class AttentionCase:
    """One input of the kernel calling convention, stored contiguous: q, k, v and the mask on the device they
    were given on (the CPU for a case built on the host or loaded, a GPU campaign's device for a case it drew),
    the variant's tensors on the CPU. It is saved and pickled from the CPU (:meth:`on`).

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
    variant: Variant = field(default_factory=Variant)

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
        put("variant", _variant(self.variant, self.shapes, (self.q, self.k, self.v)))
        self._check_layout(self.layout, argument="layout")

    @classmethod
    def create(cls, q, k, v, *, scale, causal="none", attn_mask=None, layout="contiguous",
               provenance=None, variant=None) -> "AttentionCase":
        """Validate one input (torch tensors or numpy arrays) and keep a contiguous copy of it, on its device.

        ``variant``: a :class:`~flashcheck.features.variant.Variant` (the features the case uses), or None for
        plain attention."""
        return cls(q, k, v, scale=scale, causal=causal, attn_mask=attn_mask, layout=layout,
                   provenance=provenance, variant=Variant() if variant is None else variant)

    # torch's pickles cannot load the quantized formats' storages: a case (sent to a worker process) carries
    # their tensors as bits.
    def __getstate__(self) -> dict:
        on_host = self.on("cpu")  # a pickle crosses to another process: never a GPU's memory
        return {f.name: _as_bits(getattr(on_host, f.name)) for f in dataclasses.fields(self)}

    def __setstate__(self, state: dict) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, _from_bits(value))

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
        """Bool (B, Hq, Nq, Nk), on the case's device: True where query i may attend key j under causal and
        attn_mask."""
        return masks.visible(self.causal, self.attn_mask, self.attention_shape, device=self.device,
                             variant=self.variant)

    def empty_rows(self) -> torch.Tensor:
        """Bool (B, Hq, Nq): rows with no visible key (the kernel's ``fully_masked_rows`` promise), a bias of
        -inf on every key included. A finite sink gives such a row a defined output (0, with lse = the sink):
        it is not empty."""
        empty = ~self.visible().any(dim=-1)
        sink = self.variant.sink
        if sink is not None:
            empty &= (sink == -math.inf).view(1, -1, 1).to(empty.device)
        return empty

    def applicable_layouts(self) -> tuple[str, ...]:
        """The layout names (default parameters) this case's numbers allow."""
        return tuple(name for name in layouts()
                     if name != "expanded" or self._layout_problem(Layout.expanded()) is None)

    @property
    def device(self) -> torch.device:
        """Where q, k, v and the mask are kept."""
        return self.q.device

    def on(self, device) -> "AttentionCase":
        """This case with q, k, v and the mask on ``device`` (itself when they are there already)."""
        device = torch.device(device)
        if self.q.device == device:
            return self
        moved = {name: getattr(self, name).to(device) for name in TENSORS}
        mask = None if self.attn_mask is None else self.attn_mask.to(device)
        return dataclasses.replace(self, **moved, attn_mask=mask)

    def with_layout(self, layout) -> "AttentionCase":
        return dataclasses.replace(self, layout=layout)

    def with_provenance(self, provenance: dict) -> "AttentionCase":
        return dataclasses.replace(self, provenance=provenance)

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
                and self.variant.equal_bits(other.variant)
                and all(a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw_bits(a).cpu(), raw_bits(b).cpu())
                        for a, b in pairs))

    def describe(self) -> str:
        return describe_inputs(self.q, self.k, self.v, scale=self.scale, causal=self.causal, attn_mask=self.attn_mask,
                               variant=self.variant, layout=self.layout)

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
        for name in TENSORS:
            t = getattr(self, name)
            out.append(materialise(t, layout, layout.applies_to(name), device,
                                    guard_size(guard_bands, tuple(t.shape))))
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

    # ---- saving and loading (the file format is flashcheck.inputs.casefile) ----------------------------

    def save(self, path_stem) -> tuple[Path, Path]:
        """Write ``<stem>.npz`` and ``<stem>.json`` atomically; return their paths."""
        return save_case(self, path_stem)

    @classmethod
    def load(cls, path) -> "AttentionCase":
        """Load a case saved by :meth:`save` (or a serving case's) from its ``.json``, its ``.npz`` or their stem."""
        return load_case(path)


def load_case(path) -> AttentionCase | ServingCase:
    """The case saved at ``path`` (its ``.json``, its ``.npz`` or their stem): dense, or a serving form's."""
    return load_saved_case(path, _built)


def _built(fields: dict, form: dict | None) -> AttentionCase | ServingCase:
    case = AttentionCase(**fields)
    return case if form is None else ServingCase(case, **form)
