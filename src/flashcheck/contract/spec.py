"""Kernel specs: what a kernel under test supports and promises, declared rather than guessed.

``@flashcheck.kernel(...)`` attaches a :class:`KernelSpec` to a callable that follows the calling
convention. Strategies draw only inputs the spec allows, and the checks hold the kernel to what the
spec promises (fully masked rows, precision).

A spec's fields come in groups by concern, each a small frozen dataclass that checks its own fields where
that concern lives: :class:`InputLimits`, :class:`MaskingPromises` and :class:`BackwardSupport` here,
:class:`~flashcheck.contract.precision.PrecisionPromises`, :class:`~flashcheck.contract.features.FeatureFlags`
and :class:`~flashcheck.contract.forms.CallingForm` beside the precision contracts, the variants' names and
the calling forms. :class:`KernelSpec` gathers their fields as its own, flat (``KernelSpec(softcap=True)``,
``spec.dtypes``), and keeps each group's checked record (``spec.inputs``, ``spec.features``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable

from ..errors import InvalidArgument
from .counts import check_count, check_sizes
from .features import FeatureFlags
from .formats import DEVICES, DTYPES, FORMATS, name_of_dtype
from .forms import CallingForm, convention_fields
from .head_dims import MAX_HEAD_DIM
from .precision import PrecisionPromises
from .validation import CAUSAL_MODES, Shapes

__all__ = ["KernelSpec", "Kernel", "kernel", "DEFAULT_SPEC", "FULLY_MASKED_PROMISES", "BACKWARD_FIX", "promise_note",
           "InputLimits", "MaskingPromises", "BackwardSupport", "GROUPS"]

FULLY_MASKED_PROMISES = ("zero", "nan", "any")


def _tuple_of(argument: str, value, allowed, *, allow_empty: bool = False) -> tuple:
    items = (value,) if isinstance(value, str) else tuple(value)
    bad = [x for x in items if x not in allowed]
    if bad or not (items or allow_empty):
        raise InvalidArgument(argument, value, f"unknown value(s) {bad}" if bad else "empty",
                              f"Choose from {list(allowed)}.")
    return items


# What a head dim past flashcheck's limit is told: past it, neither the oracle nor the budget was audited.
_HEAD_DIM_FIX = (f"flashcheck checks head dims up to {MAX_HEAD_DIM}: declare max_head_dim and head_dims within "
                 f"1 to {MAX_HEAD_DIM}.")


# Input classes a spec can keep campaigns away from: known defects of a kernel that every campaign
# would otherwise find again, each with a test that keeps it visible (see the PyTorch adapters).
EXCLUSIONS = {
    "negative_scale": "a negative softmax scale",
    "tiny_scale": "a softmax scale 10^-4 times the default (the 'tiny' scale regime)",
    "bottom_right_more_queries": "causal='bottom_right' with Nq > Nk (rows with no visible key)",
    "stride0_heads": "K and V heads as stride-0 views (the 'expanded' layout)",
    "empty_sequences": "serving batches holding a sequence with no queries or no keys (the length regimes "
                       "empty_sequences and fewer_tokens_than_batch)",
    "empty_batch": "a serving batch of one sequence with no queries and no keys (no token at all)",
    # Classes of the backward pass, known from the exact gradients (judged once the oracle has run):
    "ds_past_range": "an exact dS = P (dP - D) past the dtype's largest value (kernels that round dS to it)",
    "scaled_ds_past_range": "an exact scale x dS past the dtype's largest value (kernels that scale dS before "
                            "rounding it)",
    "group_share_past_range": "an exact dK or dV share of one query head of a GQA group, or the group's shares "
                              "summed in head order, past the dtype's largest value (kernels that round each "
                              "head's share, or the running sum, before summing the group)",
}
# The classes above that only the exact gradients tell apart: campaigns skip such a case once judged.
GRADIENT_EXCLUSIONS = ("ds_past_range", "scaled_ds_past_range", "group_share_past_range")


@dataclass(frozen=True)
class InputLimits:
    """The inputs a kernel accepts: dtypes, devices, causal modes, mask, heads and shapes.

    ``head_dims`` lists the allowed head dims (``None``: any from ``min_head_dim`` to ``max_head_dim``), each at
    most :data:`~flashcheck.contract.head_dims.MAX_HEAD_DIM`, as ``max_head_dim`` (which also caps Dv);
    ``dv_equals_d`` forbids Dv != D; ``seq_multiple`` requires Nq and Nk to be multiples of it;
    ``equal_lengths`` requires Nq == Nk; ``max_seqlen`` caps both lengths. ``excludes`` names input classes of
    :data:`EXCLUSIONS` that strategies do not draw: a kernel's known defects, kept out of campaigns so that
    they find something new (the verdict on such an input, when given one, is still the real one).
    """

    dtypes: tuple = DTYPES
    causal: tuple = ("none",)
    attn_mask: bool = False
    gqa: bool = False
    head_dims: tuple | None = None
    min_head_dim: int = 1
    max_head_dim: int = 256
    dv_equals_d: bool = True
    seq_multiple: int = 1
    equal_lengths: bool = False
    max_seqlen: int | None = None
    devices: tuple = DEVICES
    excludes: tuple = ()

    def __post_init__(self):
        put = functools.partial(object.__setattr__, self)
        put("dtypes", _tuple_of("dtypes", self.dtypes, tuple(FORMATS)))
        put("causal", _tuple_of("causal", self.causal, CAUSAL_MODES))
        put("devices", _tuple_of("devices", self.devices, DEVICES))
        put("excludes", _tuple_of("excludes", self.excludes, tuple(EXCLUSIONS), allow_empty=True))
        put("head_dims", check_sizes("head_dims", self.head_dims, maximum=MAX_HEAD_DIM, fix=_HEAD_DIM_FIX))
        check_count("min_head_dim", self.min_head_dim)
        check_count("max_head_dim", self.max_head_dim, maximum=MAX_HEAD_DIM, fix=_HEAD_DIM_FIX)
        if self.min_head_dim > self.max_head_dim:
            raise InvalidArgument("min_head_dim", self.min_head_dim, f"exceeds max_head_dim={self.max_head_dim}",
                                  "Pass min_head_dim <= max_head_dim.")
        check_count("seq_multiple", self.seq_multiple)
        check_count("max_seqlen", self.max_seqlen, none_ok=True)

    def allowed_head_dims(self) -> tuple:
        if self.head_dims is not None:
            return self.head_dims
        return tuple(range(self.min_head_dim, self.max_head_dim + 1))

    def head_dims_problem(self, d: int, dv: int) -> str | None:
        """Why these limits exclude head dims D = ``d`` and Dv = ``dv``, or None if they allow them."""
        if d not in self.allowed_head_dims():
            takes = ("not among its head_dims" if self.head_dims is not None
                     else f"outside min_head_dim={self.min_head_dim} to max_head_dim={self.max_head_dim}")
            return f"head dim {d} {takes}"
        if self.dv_equals_d and dv != d:
            return f"Dv={dv} differs from D={d} (dv_equals_d=True)"
        if dv > self.max_head_dim:
            return f"Dv={dv} above max_head_dim={self.max_head_dim}"
        return None

    def unsupported(self, shapes: Shapes, *, dtype, causal: str, has_mask: bool) -> str | None:
        """Why these limits exclude this input, or None if it is supported."""
        name = name_of_dtype(dtype) if not isinstance(dtype, str) else dtype
        if name not in self.dtypes:
            return f"dtype {name} not in {self.dtypes}"
        if causal not in self.causal:
            return f"causal={causal!r} not in {self.causal}"
        if has_mask and not self.attn_mask:
            return "the kernel takes no attn_mask"
        if shapes.heads_q != shapes.heads_kv and not self.gqa:
            return f"GQA ({shapes.heads_q} query heads, {shapes.heads_kv} key heads) not supported"
        head_dims = self.head_dims_problem(shapes.head_dim, shapes.head_dim_v)
        if head_dims:
            return head_dims
        if shapes.n_q % self.seq_multiple or shapes.n_k % self.seq_multiple:
            return f"lengths {shapes.n_q}, {shapes.n_k} not multiples of {self.seq_multiple}"
        if self.equal_lengths and shapes.n_q != shapes.n_k:
            return f"Nq={shapes.n_q} != Nk={shapes.n_k}"
        if self.max_seqlen is not None and max(shapes.n_q, shapes.n_k) > self.max_seqlen:
            return f"length above max_seqlen={self.max_seqlen}"
        return None


@dataclass(frozen=True)
class MaskingPromises:
    """What a kernel promises where keys are masked.

    ``fully_masked_rows``: a row with no visible key gives ``"zero"`` (out 0, lse -inf), ``"nan"``, or
    ``"any"`` (not checked). ``nan_safe_masking``: a NaN stored in a key no query may see never reaches the
    output: the kernel does not read such keys, or masks before it multiplies (off by default, since a
    correct kernel that computes 0 x V for a masked key's row gives NaN there). Huge finite values in such
    keys must never leak, whatever the spec says.
    """

    fully_masked_rows: str = "any"
    nan_safe_masking: bool = False

    def __post_init__(self):
        if self.fully_masked_rows not in FULLY_MASKED_PROMISES:
            raise InvalidArgument("fully_masked_rows", self.fully_masked_rows, "unknown promise",
                                  f"Use one of {list(FULLY_MASKED_PROMISES)}.")


@dataclass(frozen=True)
class BackwardSupport:
    """The backward pass a kernel has.

    ``backward``: autograd differentiates the kernel (:func:`flashcheck.check_backward` judges dQ, dK, dV);
    ``deterministic_backward``: two identical backward calls give the same bits. ``backward_excludes``: more
    classes of :data:`EXCLUSIONS` that backward campaigns keep out (those of ``excludes`` too): defects of the
    backward pass alone. The classes of :data:`GRADIENT_EXCLUSIONS` are known once the oracle has run, so a
    campaign counts such a case as skipped; a direct :func:`flashcheck.check_backward` or a replay still gives
    the real verdict.
    """

    backward: bool = False
    deterministic_backward: bool = True
    backward_excludes: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "backward_excludes", _tuple_of("backward_excludes", self.backward_excludes,
                                                                tuple(EXCLUSIONS), allow_empty=True))


# The groups, each under the attribute a spec keeps it as, in the order they check their fields.
GROUPS = {"inputs": InputLimits, "gradients": BackwardSupport, "masking": MaskingPromises,
          "numerics": PrecisionPromises, "calling": CallingForm, "features": FeatureFlags}
# The order of the flat fields (KernelSpec's positional arguments, the keys of as_dict), as the spec listed them
# before it had groups: runs of a group's next fields, (group, how many; None: the rest of them).
_FLAT_ORDER = (("inputs", 11), ("masking", 1), ("numerics", 1), ("inputs", 1), ("numerics", 1), ("masking", 1),
               ("numerics", 2), ("inputs", 1), ("gradients", None), ("features", None), ("calling", None),
               ("numerics", None))


def _flat_fields(cls):
    """``cls`` as a frozen dataclass whose fields are the groups' fields, in :data:`_FLAT_ORDER`."""
    left = {name: list(dataclasses.fields(group)) for name, group in GROUPS.items()}
    cls.__annotations__ = {}
    for name, count in _FLAT_ORDER:
        count = len(left[name]) if count is None else count
        run, left[name] = left[name][:count], left[name][count:]
        for f in run:
            cls.__annotations__[f.name] = f.type
            setattr(cls, f.name, dataclasses.field(default=f.default, default_factory=f.default_factory))
    assert not any(left.values()) and not set(GROUPS) & set(cls.__annotations__), (left, GROUPS)
    return dataclass(frozen=True)(cls)


@_flat_fields
class KernelSpec:
    """What a kernel supports (inputs it accepts) and promises (outputs it guarantees).

    Its fields are those of its groups (see the module's docstring), taken flat as keywords and read flat as
    attributes; each group checks and normalises its own (``dtypes="fp16"`` becomes ``("fp16",)``,
    ``precision="flash"`` the :class:`~flashcheck.contract.precision.Precision` of that name), and the spec
    keeps the checked records too: ``spec.inputs`` (:class:`InputLimits`), ``spec.masking``
    (:class:`MaskingPromises`), ``spec.numerics`` (:class:`~flashcheck.contract.precision.PrecisionPromises`),
    ``spec.gradients`` (:class:`BackwardSupport`), ``spec.features``
    (:class:`~flashcheck.contract.features.FeatureFlags`) and ``spec.calling``
    (:class:`~flashcheck.contract.forms.CallingForm`). The groups' docstrings say what each field means.
    """

    def __post_init__(self):
        for name, value in convention_fields(self).items():  # before the groups check them
            object.__setattr__(self, name, value)
        for name, group in GROUPS.items():
            record = group(**{f.name: getattr(self, f.name) for f in dataclasses.fields(group)})
            for f in dataclasses.fields(group):  # the group's normalised values, read flat
                object.__setattr__(self, f.name, getattr(record, f.name))
            object.__setattr__(self, name, record)
        for name in GROUPS:  # the checks that read more than one group
            check_with = getattr(getattr(self, name), "check_with", None)
            if check_with is not None:
                check_with(self)

    def backward_problem(self) -> str | None:
        """Why flashcheck cannot check the backward pass of a kernel of this spec (None: it can)."""
        if not self.backward:
            return "declares no backward pass"
        if self.form != "dense":
            return f"declares form={self.form!r}, and flashcheck checks the backward pass of the dense form only"
        return None

    def for_backward(self) -> "KernelSpec":
        """The spec backward campaigns draw from: ``excludes`` and ``backward_excludes`` together."""
        merged = self.excludes + tuple(x for x in self.backward_excludes if x not in self.excludes)
        return dataclasses.replace(self, excludes=merged, backward_excludes=())

    def allowed_head_dims(self) -> tuple:
        return self.inputs.allowed_head_dims()

    def unsupported(self, shapes: Shapes, *, dtype, causal: str, has_mask: bool) -> str | None:
        """Why the spec excludes this input, or None if it is supported."""
        return (self.inputs.unsupported(shapes, dtype=dtype, causal=causal, has_mask=has_mask)
                or self.calling.unsupported(shapes))

    def replace(self, **changes) -> "KernelSpec":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        # records as plain data (a campaign's database keys on the spec as JSON)
        out.update({name: value.as_dict() for name, value in out.items() if hasattr(value, "as_dict")})
        return out


def promise_note(field: str) -> str:
    """What a finding of a broken promise says of it: the spec field that makes the promise, and how to unmake it
    (the promises on by default, ``deterministic``, are ones a kernel may never have meant to make)."""
    return (f"the spec promises {field}. If the kernel makes no such promise, declare {field}=False in its "
            "@flashcheck.kernel spec")


# How a kernel with a backward_problem() gets its backward pass checked (each caller adds its own way out).
BACKWARD_FIX = ("Declare backward=True in its spec (@flashcheck.kernel(backward=True, ...)) if autograd can "
                "differentiate it and its form is dense")

# A plain callable declares nothing, so it is tested only on what every kernel must accept.
DEFAULT_SPEC = KernelSpec()


class Kernel:
    """A kernel under test: the callable, its spec and a name for reports."""

    def __init__(self, fn: Callable, spec: KernelSpec = DEFAULT_SPEC, *, name: str | None = None,
                 source: str | None = None):
        if not callable(fn):
            raise InvalidArgument("fn", fn, "a kernel must be callable",
                                  "Pass a function kernel(q, k, v, *, scale, causal, attn_mask=None).")
        if not isinstance(spec, KernelSpec):
            raise InvalidArgument("spec", spec, "expected a flashcheck.KernelSpec",
                                  "Build one with flashcheck.KernelSpec(...) or use @flashcheck.kernel(...).")
        self.fn = fn
        self.spec = spec
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
        # What resolves back to this kernel (a built-in name with options, an import path), set when it
        # was resolved from one: a saved case replays from it, whatever the display name says.
        self.source = source
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, q, k, v, *, scale, causal, attn_mask=None, **variant):
        # A variant's keyword only when the case uses it; the tensors as the spec's calling form takes them.
        return self.fn(*self.spec.calling.arguments(q, k, v), scale=scale, causal=causal, attn_mask=attn_mask,
                       **variant)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"

    def reached_as(self, source: str) -> "Kernel":
        """This kernel (a copy when it already names another source) remembering ``source``."""
        if self.source in (None, source):
            self.source = source
            return self
        return Kernel(self.fn, self.spec, name=self.name, source=source)


def as_kernel(obj, *, name: str | None = None) -> Kernel:
    """A :class:`Kernel` for a decorated kernel or a plain callable (which gets the default spec)."""
    if isinstance(obj, Kernel):
        return obj
    return Kernel(obj, DEFAULT_SPEC, name=name)


def kernel(fn: Callable | None = None, *, name: str | None = None, **spec) -> Kernel | Callable:
    """Declare what a kernel supports and promises.

    Usable bare (``@flashcheck.kernel``) or with spec options (``@flashcheck.kernel(dtypes=("fp16",))``);
    the options are those of :class:`KernelSpec`.
    """
    known = {f.name for f in dataclasses.fields(KernelSpec)}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise InvalidArgument(unknown[0], spec[unknown[0]], "not a kernel spec option",
                              f"Valid options: {sorted(known)}.")
    built = KernelSpec(**spec)

    def wrap(f: Callable) -> Kernel:
        return Kernel(f, built, name=name)

    return wrap(fn) if fn is not None else wrap
