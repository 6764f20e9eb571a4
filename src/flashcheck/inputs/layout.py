"""Memory layouts: how the same numbers are handed to a kernel (contiguous, transposed, strided, with
stride-0 heads, at a storage offset), and the NaN guard bands around them that expose out-of-bounds
reads. A layout applies when a case is materialised on a device, never to the numbers it keeps."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..contract.counts import check_count
from ..contract.formats import raw_bits
from ..errors import InvalidArgument

__all__ = ["Layout", "TENSORS", "guard_size", "layouts", "materialise"]

_LAYOUT_NAMES = ("contiguous", "transposed", "strided", "expanded", "offset")
TENSORS = ("q", "k", "v")  # the inputs a layout applies to, in the calling convention's order



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
    tensors: tuple = TENSORS
    pad_n: int = 0
    pad_d: int = 0
    storage_offset: int = 0

    def __post_init__(self):
        if self.name not in _LAYOUT_NAMES:
            raise InvalidArgument("layout", self.name, "unknown layout",
                                  f"Use one of {list(_LAYOUT_NAMES)}.")
        tensors = (self.tensors,) if isinstance(self.tensors, str) else tuple(self.tensors)
        if not tensors or any(t not in TENSORS for t in tensors):
            raise InvalidArgument("tensors", self.tensors, "expected a non-empty subset of ('q', 'k', 'v')",
                                  "Pass e.g. tensors=('k', 'v').")
        object.__setattr__(self, "tensors", tuple(t for t in TENSORS if t in tensors))
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
    def transposed(cls, *, tensors=TENSORS) -> "Layout":
        return cls("transposed", tensors=tensors)

    @classmethod
    def strided(cls, *, pad_n: int = 3, pad_d: int = 8, tensors=TENSORS) -> "Layout":
        return cls("strided", tensors=tensors, pad_n=pad_n, pad_d=pad_d)

    @classmethod
    def expanded(cls, *, tensors=("k", "v")) -> "Layout":
        return cls("expanded", tensors=tensors)

    @classmethod
    def offset(cls, *, elements: int = 8, tensors=TENSORS) -> "Layout":
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
        default = ("k", "v") if self.name == "expanded" else TENSORS
        if self.tensors != default:
            params.append("tensors=" + "".join(self.tensors))
        return self.name + (f"({','.join(params)})" if params else "")

    def applies_to(self, tensor: str) -> bool:
        return tensor in self.tensors


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


def guard_size(guard_bands, shape: tuple) -> int:
    if guard_bands is False:
        return 0
    if guard_bands is True:
        # Wide enough that a kernel overrunning by a whole 128-row tile still lands in NaN.
        return max(1024, 128 * shape[-1])
    return check_count("guard_bands", guard_bands, minimum=0)


def materialise(t: torch.Tensor, layout: Layout, applies: bool, device: torch.device, guard: int):
    extent, offset, strides, head_slice = _plan(tuple(t.shape), layout, applies)
    # Everything that is not the tensor (gaps, prefix, guard bands) is NaN, so reading it shows.
    buffer = torch.full((guard + extent + guard,), float("nan"), dtype=t.dtype, device=device)
    base = guard + offset
    view = buffer.as_strided(tuple(t.shape), strides, base)
    if head_slice is None:
        raw_bits(view).copy_(raw_bits(t))
    else:
        src = t[:, head_slice]
        dst = buffer.as_strided(tuple(src.shape), (strides[0], 1, strides[2], strides[3]), base)
        raw_bits(dst).copy_(raw_bits(src))
    return view


