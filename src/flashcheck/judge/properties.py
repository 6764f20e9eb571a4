"""Exact properties of a correct attention kernel, checked with no tolerance at all.

- ``determinism``: two identical calls give bit-identical output.
- ``poison``: keys no query can see (masked out for every row of their kv head), poisoned with huge
  values (2^16 times the largest real key in K, the dtype's largest value in V), and with NaN when the spec promises ``nan_safe_masking``, leave
  the output bit-identical.
- ``guard_bands``: memory right before and after each input holds NaN; the output stays bit-identical
  (an out-of-bounds read shows up as NaN or as changed bits).
- ``layout``: the same numbers in another memory layout (contiguous, transposed, strided, offset)
  give output within the error budget, bit-identical when the spec promises ``layout_invariant``
  (a GPU compiler or library may pick other instructions for other strides: other legal rounding).
- ``batch``: the last sequence of a batch, run alone, gives the bits it got inside the batch. Many
  correct kernels change their split or tiling with the batch size, so this is information (a note
  on the verdict) unless the spec promises ``batch_invariant``.
- ``neutral``: each variant feature the spec declares and the case does not use, at its neutral value
  (the feature's own, such as a cap of inf), gives the bits of the case: bit-identical when the spec
  promises ``neutral_variants``, else within the budget.
- ``bias_shift``: for a kernel that takes a bias a row's constant can shift (a bias feature's ``row_shift``),
  a constant added to each row's bias (exact in the bias's dtype; a row-constant bias where the case has
  none) leaves the exact output unchanged and moves the lse by it: the output's bits under
  ``bias_shift_invariant``, else the shifted case's own budget.
- ``descale``: for fp8 inputs, q, k and v each times 2 with its descale halved (or halved, the descale
  doubled, where doubling would leave fp8's range; q's descale doubled and k's halved where neither q nor
  k can be rescaled exactly) is the same exact problem: within the case's budget. It catches a descale
  ignored or applied twice even where the case's descales are 1.

Each property reruns the kernel once or twice and compares bits with the first run's output (+0 and
-0 count as one value).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..contract.formats import SCALE_FINDING, SCALE_PROPERTY, raw_bits
from ..contract.quantization import CODES
from ..contract.spec import KernelSpec, promise_note
from ..features.registry import REGISTRY, by_term
from ..inputs.case import AttentionCase
from ..inputs.quantization import rescaled_case
from ..inputs.serving import poison_values
from .diagnose import diagnose_elements, first_index
from .verdict import BUG, Finding

__all__ = ["PROPERTIES", "PROPERTY_FINDINGS", "differs", "rescaled_case",
           "PROPERTY_EVERY", "PROPERTY_KINDS", "properties_for", "hidden_keys", "check_properties",
           "neutral_cases", "reordered_cases"]

# Each property, in the order they run, and the finding kind it gives when it fails (a rerun that crashes: crash).
PROPERTY_FINDINGS = {"determinism": "nondeterminism", "poison": "poison_leak", "guard_bands": "poison_leak",
                     "layout": "layout_dependence", "batch": "batch_dependence", "neutral": "neutral_variant",
                     "bias_shift": "bias_shift_dependence", "reorder": "order_dependence",
                     SCALE_PROPERTY: SCALE_FINDING}
PROPERTIES = tuple(PROPERTY_FINDINGS)
# The finding kinds only the properties give: a bug of one of them needs the properties to show again.
PROPERTY_KINDS = frozenset(PROPERTY_FINDINGS.values())
# Campaigns and the self-test check the properties on every PROPERTY_EVERY-th case: each costs up to
# five more kernel calls, and a property defect is seldom specific to one case's numbers.
PROPERTY_EVERY = 4


def properties_for(key: int) -> tuple:
    """The properties to check on the case with this key (a case index, or a recipe's seed: a campaign
    must decide from the recipe alone, or hypothesis could not replay a failure while shrinking)."""
    return PROPERTIES if key % PROPERTY_EVERY == 0 else ()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return raw_bits(t.detach().contiguous())


def differs(a, b) -> torch.Tensor | None:
    """Element map where two outputs differ in bits (None when shapes or dtypes differ).

    +0 and -0 are the same value here: 0 * v takes the sign of v, so a zero weight on a poisoned key
    may flip a zero's sign without anything of that key reaching the output.
    """
    if not isinstance(b, torch.Tensor) or a.shape != b.shape or a.dtype != b.dtype:
        return None
    return (_bits(a) != _bits(b)) & ~((a == 0) & (b == 0))


def hidden_keys(case: AttentionCase, *, by_bias: bool = True) -> torch.Tensor:
    """Bool (B, Hkv, Nk): keys that no query of any head sharing that kv head may attend (``by_bias``:
    counting those only a -inf bias hides)."""
    s = case.shapes
    if not by_bias and case.variant.biased:
        case = dataclasses.replace(case, variant=case.variant.replace(**{f.name: None for f in by_term("bias")}))
    vis = case.visible().view(s.batch, s.heads_kv, s.group, s.n_q, s.n_k)
    return ~vis.any(dim=2).any(dim=2)


def _with_value(t: torch.Tensor, where: torch.Tensor, value: float) -> torch.Tensor:
    """``t`` with ``value`` (rounded to t's dtype) at ``where``, written as bits (fp8 has no masked fill)."""
    out = t.clone()
    raw_bits(out)[where.to(t.device)] = raw_bits(torch.tensor([value], device=t.device).to(t.dtype))
    return out


def _poisoned(case: AttentionCase, hidden: torch.Tensor, value_k: float, value_v: float) -> AttentionCase:
    k, v = _with_value(case.k, hidden, value_k), _with_value(case.v, hidden, value_v)
    return AttentionCase.create(case.q, k, v, scale=case.scale, causal=case.causal, attn_mask=case.attn_mask,
                                layout=case.layout, provenance=case.provenance, variant=case.variant)


def _other_layout(case: AttentionCase) -> str:
    """One other layout to compare with: strided for a contiguous case, contiguous otherwise."""
    return "strided" if case.layout.name == "contiguous" else "contiguous"


def check_properties(run, case: AttentionCase, baseline, *, device, spec: KernelSpec, properties=PROPERTIES,
                     judge=None, notes: list | None = None, regime: str | None = None) -> list[Finding]:
    """Findings of the exact properties; ``run(case, q, k, v, mask)`` returns the KernelRun of ``case`` (a
    rerun's case: its causal alignment and variant) on those tensors.

    ``spec`` is the kernel's: the properties read its promises (``deterministic``, ``nan_safe_masking``,
    ``fully_masked_rows``, ``layout_invariant``, ``batch_invariant``). ``judge(out, lse)`` returns the
    findings of an output against the case's budget; another layout's output whose bits differ is judged
    with it (and must not differ at all under ``layout_invariant``).

    ``baseline`` is the KernelRun of the case as given. A rerun that crashes is a crash finding. When
    the spec promises nothing for fully masked rows (``"any"``), those rows are not compared: such a
    kernel may legally fill them from V (cuDNN gives the mean of V).
    """
    reruns = _Reruns(run, case, baseline, device, spec, judge, notes, regime, case.empty_rows().to(device))
    for name in PROPERTIES:  # in this order, whatever the order asked
        # After a crashed rerun the process may be unusable (a CUDA error is sticky): check nothing more.
        if name in properties and not reruns.crashed:
            _CHECKS[name](reruns)
    return reruns.findings


@dataclass
class _Reruns:
    """One case's reruns of the kernel for its properties, each compared with the first run, and the
    findings they gave."""

    run: Callable  # (case, q, k, v, mask) -> KernelRun
    case: AttentionCase
    baseline: object  # the KernelRun of the case as given
    device: torch.device
    spec: KernelSpec
    judge: Callable | None
    notes: list | None
    regime: str | None
    empty: torch.Tensor  # the rows with no visible key
    findings: list[Finding] = field(default_factory=list)

    @property
    def crashed(self) -> bool:
        return any(f.kind == "crash" for f in self.findings)

    def rerun(self, case: AttentionCase, **placement):
        """The kernel on ``case`` placed on the device (``placement``: ``to_device``'s layout or guard bands)."""
        return self.run(case, *case.to_device(self.device, **placement))

    def finding(self, kind: str, diagnosis: str, **kw) -> None:
        self.findings.append(Finding(kind, BUG, diagnosis, regime=self.regime, **kw))

    def compare(self, kind: str, what: str, rerun, *, lse: bool = True, promise: str | None = None,
                **details) -> None:
        """A ``kind`` finding when ``rerun`` (of ``what``) changed a bit of the output or (``lse``) lse; ``promise``:
        the spec field whose promise that breaks, which the finding names."""
        found = len(self.findings)
        self._compare(kind, what, rerun, lse=lse, **details)
        if promise is not None:
            for f in self.findings[found:]:
                if f.kind == kind:
                    f.diagnosis += f" ({promise_note(promise)})"

    def _compare(self, kind: str, what: str, rerun, *, lse: bool, **details) -> None:
        if rerun.error is not None:
            self.finding("crash", f"{what}: {type(rerun.error).__name__}: {rerun.error}"[:300],
                         details={"traceback": rerun.traceback, **details})
            return
        diff = self._changed_bits(self.baseline.out, rerun.out, self.empty[..., None])
        if diff is None:
            self.finding(kind, f"{what}: the output changed shape or dtype", details=details)
        elif bool(diff.any()):
            self.finding(kind, f"{what} changed the output: " +
                         diagnose_elements(diff, self.case.shapes, empty_rows=self.empty),
                         index=first_index(diff), details=details)
        elif lse and self.baseline.lse is not None:
            lse_diff = self._changed_bits(self.baseline.lse, rerun.lse, self.empty)
            if lse_diff is None or bool(lse_diff.any()):
                self.finding(kind, f"{what} changed the lse", details=details)

    def _changed_bits(self, a, b, empty) -> torch.Tensor | None:
        """:func:`differs`, on the rows the spec promises something for."""
        diff = differs(a, b)
        if diff is not None and self.spec.fully_masked_rows == "any":
            diff &= ~empty
        return diff


def _determinism(reruns: _Reruns) -> None:
    if reruns.spec.deterministic:
        reruns.compare("nondeterminism", "a second identical call", reruns.rerun(reruns.case), promise="deterministic")


def _poisonable(case: AttentionCase, hidden: torch.Tensor) -> torch.Tensor:
    """The hidden keys a rerun may poison: with stride-0 heads (layout "expanded") the heads must stay
    equal, so only keys hidden in every head."""
    if case.layout.name == "expanded":
        return hidden.all(dim=1, keepdim=True).expand_as(hidden)
    return hidden


def _poison(reruns: _Reruns) -> None:
    case = reruns.case
    hidden = _poisonable(case, hidden_keys(case))
    # A kernel that quantizes inside reads every key by its scheme (k's mean, a block's largest value): a masked
    # key moves the visible keys' codes, so poisoning it changes the exact problem.
    if not bool(hidden.any()) or case.variant.quantization.quantizer:
        return
    n = int(hidden.sum())
    huge_k, fmax = poison_values("huge", case.k)
    codes = case.variant.quantization.codes  # a narrower code format (e2m1): no NaN, nothing past its largest code
    if codes:
        huge_k = fmax = max(CODES[codes])
    # A key only a -inf bias hides has weight e^-inf = 0, and 0 * NaN is NaN: no kernel promises it safe.
    masked = _poisonable(case, hidden & hidden_keys(case, by_bias=False))
    if reruns.spec.nan_safe_masking and bool(masked.any()) and not codes:
        reruns.compare("poison_leak", f"NaN in {int(masked.sum())} masked-out keys of K and V",
                       reruns.rerun(_poisoned(case, masked, float("nan"), float("nan"))), promise="nan_safe_masking")
    if not reruns.crashed:
        reruns.compare("poison_leak", f"{huge_k:g} in K and {fmax:g} in V of {n} masked-out keys",
                       reruns.rerun(_poisoned(case, hidden, huge_k, fmax)))


def _guard_bands(reruns: _Reruns) -> None:
    reruns.compare("poison_leak", "NaN in the memory around q, k and v (an out-of-bounds read)",
                   reruns.rerun(reruns.case, guard_bands=True))


def _layout(reruns: _Reruns) -> None:
    case = reruns.case
    other = _other_layout(case)
    what = f"the same numbers in the {other} layout (case: {case.layout})"
    _same_or_within(reruns, "layout_dependence", what, reruns.rerun(case, layout=other),
                    promised=reruns.spec.layout_invariant, layout=other)


def _same_or_within(reruns: _Reruns, kind: str, what: str, rerun, *, promised: bool, **details) -> None:
    """``rerun`` must give the first run's bits when ``promised``; else other bits are a bug only when that
    output breaks the budget, and a note otherwise."""
    if promised or reruns.judge is None or rerun.error is not None:
        reruns.compare(kind, what, rerun, **details)
        return
    diff = differs(reruns.baseline.out, rerun.out)
    if diff is not None and not bool(diff.any()):
        return
    broken = reruns.judge(rerun.out, rerun.lse)
    if broken:
        worst = max(broken, key=lambda f: f.ratio if f.ratio is not None else float("inf"))
        reruns.finding(kind, f"{what}: {worst.kind}: {worst.diagnosis}", index=worst.index,
                       error=worst.error, budget=worst.budget, ratio=worst.ratio, details=details)
    elif reruns.notes is not None:
        changed = "its shape" if diff is None else f"{int(diff.sum())} of {diff.numel()} output elements"
        reruns.notes.append(f"{_NOTES[kind]} bits within the budget: {what} changed {changed}")


_NOTES = {"layout_dependence": "layout-dependent", "neutral_variant": "variant-dependent",
          "order_dependence": "order-dependent",
          SCALE_FINDING: f"{SCALE_PROPERTY}-dependent"}


def neutral_cases(case: AttentionCase, spec: KernelSpec) -> list[tuple[str, AttentionCase]]:
    """(what, case) for each declared variant feature the case leaves unused, set to its neutral value (the
    feature's own, :attr:`~flashcheck.features.base.Feature.neutral`)."""
    out, variant = [], case.variant
    for feature in REGISTRY:
        if feature.neutral is None or not getattr(spec, feature.flag) or getattr(variant, feature.name) is not None:
            continue
        neutral = feature.neutral(variant, case.causal, spec, case.shapes)
        if neutral is not None:
            what, changed, causal = neutral
            out.append((what, dataclasses.replace(case, causal=causal, variant=changed)))
    return out


def _neutral(reruns: _Reruns) -> None:
    for what, case in neutral_cases(reruns.case, reruns.spec):
        if reruns.crashed:
            return
        _same_or_within(reruns, "neutral_variant", f"the case with {what}", reruns.rerun(case),
                        promised=reruns.spec.neutral_variants, neutral=what)


def reordered_cases(case: AttentionCase, spec: KernelSpec) -> list[tuple[str, AttentionCase, bool]]:
    """(what, case, promised) for each feature the case uses that can be written in another order giving the same
    exact answer (the feature's ``reordered``), and whether the spec promises the same bits for it."""
    out = []
    for feature in REGISTRY:
        value = getattr(case.variant, feature.name)
        found = None if feature.reordered is None or value is None else feature.reordered(value, spec)
        if found is not None:
            what, changed, promised = found
            out.append((what, dataclasses.replace(case, variant=case.variant.replace(**{feature.name: changed})),
                        promised))
    return out


def _reorder(reruns: _Reruns) -> None:
    for what, case, promised in reordered_cases(reruns.case, reruns.spec):
        if reruns.crashed:
            return
        _same_or_within(reruns, "order_dependence", f"the case with {what}", reruns.rerun(case), promised=promised)


def _batch(reruns: _Reruns) -> None:
    batch = reruns.case.shapes.batch
    if batch <= 1:
        return
    rerun = reruns.rerun(_last_sequence(reruns.case))
    if rerun.error is not None or not isinstance(rerun.out, torch.Tensor):
        return
    diff = differs(reruns.baseline.out[-1:], rerun.out)
    if diff is not None and not bool(diff.any()):
        return
    what = (f"the last of {batch} sequences run alone differs in "
            f"{'shape' if diff is None else f'{int(diff.sum())} of {diff.numel()} elements'}")
    if reruns.spec.batch_invariant:
        reruns.finding("batch_dependence", what + " (the spec promises batch invariance)")
    elif reruns.notes is not None:
        reruns.notes.append("batch-dependent: " + what)


def shifted_bias_case(case: AttentionCase, spec: KernelSpec) -> tuple[str, AttentionCase] | None:
    """(what, case) with c_i in {-2, -1, 1, 2} added to the bias of row i (each (b, h, i) its own), or a
    (B, Hq, Nq, 1) bias of them where the case has none, of the first bias feature the spec declares that
    has a ``row_shift``; None without one, or where the sums are not exact in the bias's dtype (then the
    exact output would move)."""
    feature = next((f for f in by_term("bias") if f.row_shift is not None and getattr(spec, f.flag)), None)
    if feature is None:
        return None
    s = case.shapes
    c = torch.tensor([-2.0, -1.0, 1.0, 2.0])[torch.arange(s.batch * s.heads_q * s.n_q) % 4]  # the variant's: the CPU
    c = c.reshape(s.batch, s.heads_q, s.n_q, 1).double()
    shifted = feature.row_shift(getattr(case.variant, feature.name), c, s, case.torch_dtype)
    if shifted is None:
        return None
    what = f"a constant in {{-2, -1, 1, 2}} added to each row's {feature.name}"
    return what, dataclasses.replace(case, variant=case.variant.replace(**{feature.name: shifted}))


def _bias_shift(reruns: _Reruns) -> None:
    found = shifted_bias_case(reruns.case, reruns.spec)
    if found is None:
        return
    what, shifted = found
    rerun = reruns.rerun(shifted)
    if reruns.spec.bias_shift_invariant or rerun.error is not None or reruns.judge is None:
        reruns.compare("bias_shift_dependence", what, rerun, lse=False)  # the lse moves by the constant
        return
    broken = reruns.judge(rerun.out, rerun.lse, shifted)
    if broken:
        worst = max(broken, key=lambda f: f.ratio if f.ratio is not None else float("inf"))
        reruns.finding("bias_shift_dependence", f"{what}: {worst.kind}: {worst.diagnosis}", index=worst.index,
                       error=worst.error, budget=worst.budget, ratio=worst.ratio)


def _rescale(reruns: _Reruns) -> None:
    rescaled = rescaled_case(reruns.case)
    if rescaled is not None:
        what, case = rescaled
        _same_or_within(reruns, SCALE_FINDING, f"the case with {what}", reruns.rerun(case), promised=False)


_CHECKS = {"determinism": _determinism, "poison": _poison, "guard_bands": _guard_bands, "layout": _layout,
           "batch": _batch, "neutral": _neutral, "bias_shift": _bias_shift, "reorder": _reorder,
           SCALE_PROPERTY: _rescale}


def _last_sequence(case: AttentionCase) -> AttentionCase:
    mask = case.attn_mask
    if mask is not None and mask.dim() == 4 and mask.shape[0] > 1:
        mask = mask[-1:]
    return AttentionCase.create(case.q[-1:], case.k[-1:], case.v[-1:], scale=case.scale, causal=case.causal,
                                attn_mask=mask, layout=case.layout, provenance=case.provenance,
                                variant=case.variant.select(batch=slice(-1, None)))
