"""A saved merge case: partial states that a merge got wrong under :func:`flashcheck.check_merge`, in the saved-case
format of :mod:`flashcheck.inputs.casefile` (an npz of the exact bits, a JSON beside it with the npz's hash), so
that ``flashcheck repro`` turns it into a script that calls the merge.

The npz holds ``outs`` (S, R, Dv) in the merge's dtype (bf16 as the integers of its bits) and ``lses`` (S, R) fp32,
both as the merge got them (the lse in the base its conventions name); the JSON the conventions and the provenance:
the merge's import path and folder, the regime, seed and index the states were drawn with, and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..contract.formats import FORMATS, format_of
from ..contract.merges import MergeConventions
from ..errors import CaseFormatError, InvalidArgument
from .casefile import MERGE_FORMAT_NAME, loaded_tensor, read_case_files, stored_array, write_case_files

__all__ = ["MergeCase", "load_merge_case"]

FORMAT_VERSION = 1


@dataclass(frozen=True, eq=False)
class MergeCase:
    """The states ``outs`` (S, R, Dv) and ``lses`` (S, R) fp32 a merge got, how it was called and where from."""

    outs: torch.Tensor
    lses: torch.Tensor
    conventions: MergeConventions
    provenance: dict = field(default_factory=dict)

    def __post_init__(self):
        outs, lses = self.outs, self.lses
        if not (isinstance(outs, torch.Tensor) and outs.dim() == 3 and outs.shape[0] >= 1):
            raise InvalidArgument("outs", outs, "expected (S, R, Dv) partial outputs", "Pass the states a merge got.")
        format_of(outs, argument="outs")
        if not (isinstance(lses, torch.Tensor) and lses.dtype == torch.float32 and lses.shape == outs.shape[:2]):
            raise InvalidArgument("lses", lses, f"expected (S, R) = {tuple(outs.shape[:2])} fp32 lse",
                                  "Pass the lse of each state and row, in fp32.")
        if self.conventions.pairwise and outs.shape[0] < 2:
            raise InvalidArgument("outs", outs, "a two-state merge is judged on two states at least",
                                  "Pass S >= 2 states.")
        object.__setattr__(self, "outs", outs.detach().cpu().contiguous())
        object.__setattr__(self, "lses", lses.detach().cpu().contiguous())

    @property
    def dtype(self) -> str:
        return format_of(self.outs).name

    def describe(self) -> str:
        s, r, dv = self.outs.shape
        regime = self.provenance.get("regime")
        return (f"{s} states of {r} rows of {dv}, {self.dtype}" + (f", regime {regime}" if regime else "")
                + f", {self.conventions.describe()}")

    def save(self, path_stem) -> tuple[Path, Path]:
        meta = {"format": MERGE_FORMAT_NAME, "format_version": FORMAT_VERSION, "describe": self.describe(),
                "dtype": self.dtype, "shapes": {"outs": list(self.outs.shape), "lses": list(self.lses.shape)},
                "conventions": self.conventions.as_dict(), "provenance": self.provenance}
        return write_case_files(path_stem, {"outs": stored_array(self.outs), "lses": stored_array(self.lses)},
                                lambda: meta)


def _check_meta(path: Path, meta) -> dict:
    fix = "Re-save the states with flashcheck.check_merge(..., save_dir=...)."
    if not isinstance(meta, dict) or meta.get("format") != MERGE_FORMAT_NAME:
        raise CaseFormatError(path, f"not a saved merge case (no \"format\": \"{MERGE_FORMAT_NAME}\")", fix)
    version = meta.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise CaseFormatError(path, f"format_version={version!r} is not one this flashcheck reads "
                              f"(1 to {FORMAT_VERSION})", "Upgrade flashcheck to read it, or re-save the states.")
    if meta.get("dtype") not in FORMATS or not isinstance(meta.get("shapes"), dict):
        raise CaseFormatError(path, f"dtype {meta.get('dtype')!r} or shapes {meta.get('shapes')!r} unknown", fix)
    try:
        meta["_conventions"] = MergeConventions(**(meta.get("conventions") or {}))
    except (InvalidArgument, TypeError) as exc:
        raise CaseFormatError(path, f"bad conventions: {exc}", fix) from None
    return meta


def load_merge_case(path) -> MergeCase:
    """The merge case saved at ``path`` (its ``.json``, ``.npz`` or their stem)."""
    meta, arrays = read_case_files(path, _check_meta)
    npz = str(path)
    fix = "The .npz and .json do not describe the same states; re-save them."
    dtypes = {"outs": FORMATS[meta["dtype"]].dtype, "lses": torch.float32}
    if sorted(arrays) != sorted(dtypes):
        raise CaseFormatError(npz, f"arrays {sorted(arrays)} found; expected {sorted(dtypes)}", fix)
    tensors = {}
    for name, dtype in dtypes.items():
        a = arrays[name]
        if a.dtype != stored_array(torch.empty(0, dtype=dtype)).dtype or list(a.shape) != meta["shapes"].get(name):
            raise CaseFormatError(npz, f"{name} is {a.dtype} {list(a.shape)}; the JSON says {meta['dtype']} "
                                  f"{meta['shapes'].get(name)}", fix)
        tensors[name] = loaded_tensor(a, dtype)
    try:
        return MergeCase(tensors["outs"], tensors["lses"], meta["_conventions"], meta.get("provenance") or {})
    except InvalidArgument as exc:
        raise CaseFormatError(npz, f"the stored states are not a valid input: {exc}", fix) from None
