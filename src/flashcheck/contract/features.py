"""The names of the attention variants (their meaning is :mod:`flashcheck.features.variant`'s): the keywords
a kernel may take, how ALiBi slopes make a bias, and where a cap and a bias meet; and the kernel spec's
declarations of them, :class:`FeatureFlags`. Torch-free, for what a command line reads before it imports
torch."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument
from .forms import SERVING_FORMS
from .block_sparse import block_sparse
from .key_sets import DUPLICATES, key_sets

__all__ = ["FEATURES", "MODULES", "ALIBI_MODES", "BIAS_ORDERS", "DUPLICATES", "FeatureFlags"]

# Each feature's name (the keyword a kernel receives, declared by the spec flag of the same name; ALiBi's is
# ``alibi``) and its module in flashcheck.features, which the registry loads, in the order a kernel receives
# them. A new feature is its module, a line here and its flag in FeatureFlags.
MODULES = {"softcap": "softcap", "alibi_slopes": "alibi", "attn_bias": "attn_bias", "window": "window",
           "chunk": "chunk", "indices": "key_sets", "block_lists": "block_lists", "sinks": "sinks"}
FEATURES = tuple(MODULES)
ALIBI_MODES = ("symmetric", "linear")
BIAS_ORDERS = ("cap_first", "bias_first")


@dataclass(frozen=True)
class FeatureFlags:
    """The variants a kernel takes and what it promises of them: the kernel spec's fields of that concern
    (:class:`~flashcheck.contract.spec.KernelSpec` takes and reads them flat).

    ``softcap``, ``attn_bias``, ``window``, ``chunk`` and ``sinks`` declare that the kernel takes the keyword
    argument of that name, ``alibi`` (``"symmetric"`` or ``"linear"``, the bias it makes of them) that it takes
    ``alibi_slopes``; a case that uses one is drawn only for a kernel that declares it, and only then does the
    kernel receive it. ``fp32_bias``: an fp32 ``attn_bias`` with fp16 or bf16 inputs (else the bias is in the
    inputs' dtype). ``bias_order``: ``"cap_first"`` (``c tanh(s / c) + bias``) or ``"bias_first"``
    (``c tanh((s + bias) / c)``). ``neutral_variants``: a declared feature at its neutral value
    (``softcap=inf``, every sink -inf, ``window=(Nk - 1, 0)`` in place of ``causal="bottom_right"``) gives the
    bits of the call without it; without the promise, the output must still stay within the error budget.
    ``bias_shift_invariant``: a constant added to a row's ``attn_bias`` (exact in its dtype) gives the output's
    bits (the lse moves by the constant); without the promise, the output must stay within the shifted case's
    budget. ``key_sets``: the kernel takes ``indices``, an index set per query, read by the declared convention
    (:mod:`flashcheck.contract.key_sets`): None, True (the defaults) or a
    :class:`~flashcheck.contract.key_sets.KeySets`. ``block_sparse``: the kernel takes key-block lists per query
    block (:mod:`flashcheck.contract.block_sparse`): None, True (the defaults) or a
    :class:`~flashcheck.contract.block_sparse.BlockSparse`.
    """

    softcap: bool = False
    alibi: str | None = None
    attn_bias: bool = False
    fp32_bias: bool = False
    bias_order: str = "cap_first"
    window: bool = False
    chunk: bool = False
    sinks: bool = False
    neutral_variants: bool = False
    bias_shift_invariant: bool = False
    key_sets: object = None
    block_sparse: object = None

    def __post_init__(self):
        object.__setattr__(self, "key_sets", key_sets(self.key_sets))
        object.__setattr__(self, "block_sparse", block_sparse(self.block_sparse))
        if self.alibi not in (None,) + ALIBI_MODES:
            raise InvalidArgument("alibi", self.alibi, "unknown ALiBi mode",
                                  f"Use None or one of {list(ALIBI_MODES)}.")
        if self.bias_order not in BIAS_ORDERS:
            raise InvalidArgument("bias_order", self.bias_order, "unknown order",
                                  f"Use one of {list(BIAS_ORDERS)}.")

    def check_with(self, spec) -> None:
        """The declarations against the rest of ``spec``: the serving forms take no dense mask or bias."""
        if spec.form != "dense" and (spec.attn_mask or self.attn_bias):
            raise InvalidArgument("form", spec.form, "a serving form takes no attn_mask or attn_bias here",
                                  "Declare attn_mask=False and attn_bias=False with form="
                                  f"{' or '.join(map(repr, SERVING_FORMS))}.")
