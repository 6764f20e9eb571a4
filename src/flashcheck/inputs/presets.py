"""Campaign presets: TOML files naming regimes, dtypes, size ranges and budgets.

Built-in presets live in the repository's ``strategies/`` folder; a user preset is any TOML file given
by path. Every key is validated: an unknown key or a value of the wrong kind is refused by name.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from ..contract.features import FEATURES
from ..contract.formats import ALL_DTYPES
from ..contract.head_dims import head_dim_choices
from ..errors import InvalidArgument

__all__ = ["Preset", "load_preset", "builtin_presets", "PRESET_DIR", "token_cap_problem"]

# An installed package carries the presets as flashcheck/_presets; a source checkout has them in the
# repository's strategies/ (see pyproject.toml).
_INSTALLED = Path(__file__).resolve().parents[1] / "_presets"
PRESET_DIR = _INSTALLED if _INSTALLED.is_dir() else Path(__file__).resolve().parents[3] / "strategies"


@dataclass(frozen=True)
class Preset:
    name: str
    description: str = ""
    max_examples: int = 100
    time_budget: float | None = None
    dtypes: tuple = ALL_DTYPES  # filtered by each kernel's spec
    value_regimes: tuple | None = None
    mask_regimes: tuple | None = None
    scale_regimes: tuple | None = None
    layouts: tuple | None = None
    variants: tuple | None = None  # variant features to draw (None: every one the kernel's spec declares)
    form_values: tuple | None = None  # the serving form's own value regimes to draw (None: all of them)
    min_n: int = 1
    max_n: int = 256
    max_batch: int = 2
    max_heads: int = 4
    head_dims: tuple | None = None  # ints and HeadDimPairs (a TOML [D, Dv] pair fixes both)
    max_queries: int | None = None  # queries a sequence at most (None: lengths from min_n to max_n, as the keys)
    max_total_tokens: int | None = None  # batch x (Nq + Nk) of a case at most: larger batches are cut to fit
    max_decode_n: int | None = None  # half the cases decode steps (1 to 16 queries) against min_n to it keys
    large_tensors: bool = False  # one case in eight (fp16, bf16) with its largest tensor past 2^31 elements
    jobs: int = 1  # worker processes (fuzz --jobs, which wins over it)
    source: str = field(default="", compare=False)

    def strategy_options(self) -> dict:
        """The keyword options of :func:`flashcheck.inputs.recipe_draws.recipes` this preset sets."""
        keys = ("value_regimes", "mask_regimes", "scale_regimes", "layouts", "variants", "min_n", "max_n",
                "max_batch", "max_heads", "head_dims", "max_queries", "max_total_tokens", "max_decode_n",
                "large_tensors")
        options = {k: getattr(self, k) for k in keys}
        if self.form_values is not None:  # only where set: the options key a campaign's stored examples
            options["form_values"] = self.form_values
        return options


_KINDS = {"description": str, "max_examples": int, "time_budget": (int, float), "min_n": int, "max_n": int,
          "max_batch": int, "max_heads": int, "jobs": int, "max_queries": int, "max_total_tokens": int,
          "max_decode_n": int, "large_tensors": bool}
_KIND_NAMES = {str: "a string", int: "an integer", bool: "true or false"}
_LISTS = {"dtypes": str, "value_regimes": str, "mask_regimes": str, "scale_regimes": str, "layouts": str,
          "variants": str, "head_dims": (int, list), "form_values": str}
_LIST_ITEMS = {"head_dims": "head dims D or pairs [D, Dv]"}


def token_cap_problem(max_total_tokens: int | None, max_n: int, max_queries: int | None) -> str | None:
    """What is wrong with a cap of ``max_total_tokens`` on a case's batch x (Nq + Nk), or None: it must hold one
    sequence of the longest lengths."""
    longest = max_n + (max_queries or max_n)
    if max_total_tokens is not None and max_total_tokens < longest:
        return f"below one sequence of {longest} tokens (max_n + max_queries, or 2 max_n without max_queries)"
    return None


def _named_apart() -> str:
    """The features whose keyword is not their spec flag, as ``<keyword> for <title>``: what a preset names."""
    from ..features.registry import REGISTRY  # torch: a preset is read before it, and only a bad one needs this

    return ", ".join(f"{f.name} for {f.title or f.name}" for f in REGISTRY if f.flag != f.name)


def builtin_presets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(PRESET_DIR.glob("*.toml"))} if PRESET_DIR.is_dir() else {}


def load_preset(name_or_path: str | Path) -> Preset:
    """A built-in preset by name (``smoke``, ``adversarial``, ...) or a TOML file by path."""
    builtins = builtin_presets()
    text = str(name_or_path)
    if text in builtins:
        path = builtins[text]
    else:
        path = Path(text)
        if not path.is_file():
            raise InvalidArgument("preset", text, "neither a built-in preset nor a TOML file",
                                  f"Use one of {sorted(builtins)} or the path of a .toml file.")
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InvalidArgument("preset", str(path), f"cannot be read as TOML ({exc})",
                              "Fix the file's TOML syntax.") from None
    known = {f.name for f in fields(Preset)} - {"name", "source"}
    for key, value in data.items():
        if key not in known:
            raise InvalidArgument(f"{path.name}: {key}", value, "unknown preset key",
                                  f"Valid keys: {sorted(known)}.")
        if key in _KINDS and (isinstance(value, bool) != (_KINDS[key] is bool) or not isinstance(value, _KINDS[key])):
            raise InvalidArgument(f"{path.name}: {key}", value, "wrong kind of value",
                                  f"Give {key} as {_KIND_NAMES.get(_KINDS[key], 'a number')}.")
        if key in _LISTS:
            if not isinstance(value, list) or not all(isinstance(x, _LISTS[key]) for x in value):
                items = _LIST_ITEMS.get(key) or f"{_LISTS[key].__name__}s"
                raise InvalidArgument(f"{path.name}: {key}", value, "expected a list",
                                      f"Give {key} as a TOML list of {items}.")
            data[key] = tuple(value)
    if "head_dims" in data:
        data["head_dims"] = head_dim_choices(f"{path.name}: head_dims", data["head_dims"])
    unknown = sorted(set(data.get("variants", ())) - set(FEATURES))
    if unknown:
        raise InvalidArgument(f"{path.name}: variants", list(data["variants"]), f"unknown features {unknown}",
                              f"Name features of {list(FEATURES)} ({_named_apart()}).")
    for key in ("max_examples", "min_n", "max_n", "max_batch", "max_heads", "jobs", "max_queries", "max_total_tokens",
                "max_decode_n"):
        if key in data and data[key] < 1:
            raise InvalidArgument(f"{path.name}: {key}", data[key], "must be at least 1", f"Set {key} >= 1.")
    if data.get("max_decode_n", math.inf) < data.get("min_n", 1):
        raise InvalidArgument(f"{path.name}: max_decode_n", data["max_decode_n"], "below min_n",
                              "Set max_decode_n >= min_n (decode steps draw their keys from min_n to it).")
    preset = Preset(name=path.stem, source=str(path), **data)
    problem = token_cap_problem(preset.max_total_tokens, preset.max_n, preset.max_queries)
    if problem:
        raise InvalidArgument(f"{path.name}: max_total_tokens", preset.max_total_tokens, problem,
                              "Raise max_total_tokens or lower max_n and max_queries.")
    return preset
