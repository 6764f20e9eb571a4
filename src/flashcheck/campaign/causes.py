"""Root causes: which distinct bug a failing case shows, so that a campaign reports bugs, not raw findings.

A kernel that assumes contiguous inputs fails on every strided case, and a numerical defect fails on
many cases of every layout; both show as ``over_budget`` findings. Telling them apart takes an
experiment, not a reading of the findings: a case that fails in a non-contiguous layout is run again on
the same numbers in the contiguous layout (:func:`needs_layout_triage`), and if that passes, or fails
with another cause, the cause is the layout (one cause for all non-contiguous layouts: the kernel's
handling of strides). Otherwise the findings name the cause, each by one small named rule below, tried in
order; the first that applies wins:

    crash (by exception type), hang, a wrong result contract (shape, dtype, device), a broken promise
    (fully masked rows, determinism, batch invariance), a read of masked-out or out-of-bounds memory,
    masked-out keys let in (the output matches attention over them), non-finite output alone, a
    numerical error over the budget (per pass, and per gradient for the backward), a property of the
    variants or of the page pool (a neutral variant, a bias shift, fp8 descales, the page order), and last
    a SUSPICIOUS output outside the reorderings' envelope.

Every finding kind (:data:`~flashcheck.judge.verdict.FINDING_KINDS`) has its rule; one without would still be
named by its kind (``finding:<kind>``), never left nameless.

A cause is deliberately coarse: the regimes, dtypes and layouts that hit it are what a campaign counts
per cause, not what splits it, so that one defect seen in fp16 and bf16, or as NaN on one case and as a
large error on another, stays one bug.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..contract.formats import SCALE_CAUSE, SCALE_FINDING
from ..judge.verdict import SUSPICIOUS, Verdict

__all__ = ["Cause", "needs_layout_triage", "root_cause"]


@dataclass(frozen=True)
class Cause:
    """A distinct bug: ``key`` is stable (it groups cases and combines campaigns), ``title`` is for people."""

    key: str
    title: str


def needs_layout_triage(verdict: Verdict, layout_name: str) -> bool:
    """Whether to rerun a failing case in the contiguous layout before naming its cause."""
    return layout_name != "contiguous" and not verdict.ok and not verdict.skipped


def root_cause(verdict: Verdict, *, layout_name: str = "contiguous", contiguous: Verdict | None = None) -> Cause:
    """The cause of a failing ``verdict`` on a case in the layout ``layout_name``; ``contiguous`` is the
    verdict on the same numbers in the contiguous layout (with the same properties but the layout one),
    when it was run."""
    cause = _by_findings(verdict)
    if contiguous is not None and not contiguous.skipped and layout_name != "contiguous":
        # Contiguous, the same numbers pass, or fail otherwise (a crash here, a numerical error there):
        # what this layout adds is the layout's defect.
        if contiguous.ok or _by_findings(contiguous) != cause:
            return _layout_cause()
    return cause


def _by_findings(verdict: Verdict) -> Cause:
    own = [f for f in verdict.findings if not (f.details or {}).get("layout")]
    if verdict.findings and not own:  # only the layout property's rerun in another layout failed
        return _layout_cause()
    kinds = {f.kind for f in own}
    for rule in _RULES:
        cause = rule(verdict, kinds)
        if cause is not None:
            return cause
    kind = sorted(kinds)[0] if kinds else "none"  # a kind no rule knows yet: named by it all the same
    return Cause(f"finding:{kind}", f"{kind} findings")


def _layout_cause() -> Cause:
    # One cause for every non-contiguous layout: the kernel's handling of strides. Which layouts fail is
    # what a campaign counts for it (a kernel that assumes contiguity fails transposed, strided and
    # stride-0 alike).
    return Cause("layout", "fails only in non-contiguous layouts: the same numbers pass when contiguous (an "
                           "assumption about strides)")


def _finding(verdict: Verdict, kind: str):
    return next(f for f in verdict.findings if f.kind == kind)


def _crash(verdict: Verdict, kinds: set) -> Cause | None:
    if "crash" not in kinds:
        return None
    f = _finding(verdict, "crash")
    if (f.details or {}).get("died"):
        return Cause("crash:process_died", "the kernel's process died (a segfault, an abort or an exit)")
    if "CUDA context broke" in f.diagnosis:
        return Cause("crash:cuda_context", "the CUDA context broke (an illegal memory access or a device assert)")
    # "a property's rerun: TypeError: ..." -> TypeError; the message's numbers differ from case to case
    error = re.search(r"([A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))\b", f.diagnosis)
    name = error.group(1) if error else "error"
    return Cause(f"crash:{name}", f"the kernel raised {name}")


def _input_written(verdict: Verdict, kinds: set) -> Cause | None:
    if "input_written" not in kinds:
        return None
    names = "".join(sorted((f.details or {}).get("tensor", "") for f in verdict.findings if f.kind == "input_written"))
    return Cause(f"input_written:{names or 'input'}", f"the kernel writes into its input {', '.join(names) or 'tensors'}"
                                                      " (its caller's tensor changes)")


def _hang(verdict: Verdict, kinds: set) -> Cause | None:
    return Cause("timeout", "the kernel hangs (no result within the case timeout)") if "timeout" in kinds else None


def _contract(verdict: Verdict, kinds: set) -> Cause | None:
    if "wrong_output" not in kinds:
        return None
    return Cause("wrong_output", "the output breaks the calling convention (shape, dtype or device)")


_PROMISES = {
    "masked_row_promise": ("promise:fully_masked_rows", "rows with no visible key break the spec's "
                                                        "fully_masked_rows promise"),
    "nondeterminism": ("promise:determinism", "two identical calls give different bits (the spec promises "
                                              "determinism)"),
    "batch_dependence": ("promise:batch_invariance", "a sequence's output depends on the rest of its batch (the "
                                                     "spec promises batch invariance)"),
    "split_dependence": ("promise:split_invariance", "two split counts give different bits (the spec promises "
                                                     "split invariance)"),
}


def _named_in(table: dict, kinds: set) -> Cause | None:
    """The cause ``table`` gives the first (by name) of ``kinds`` it names, or None."""
    named = sorted(kinds & table.keys())
    return Cause(*table[named[0]]) if named else None


def _promise(verdict: Verdict, kinds: set) -> Cause | None:
    return _named_in(_PROMISES, kinds)


def _poison(verdict: Verdict, kinds: set) -> Cause | None:
    if "poison_leak" not in kinds:
        return None
    if any("out-of-bounds" in f.diagnosis for f in verdict.findings if f.kind == "poison_leak"):
        return Cause("reads:out_of_bounds", "memory past the ends of q, k or v reaches the output "
                                            "(an out-of-bounds read)")
    return Cause("reads:masked_keys", "values of masked-out keys reach the output (NaN or huge K/V there "
                                      "changes it)")


def _masked_keys_let_in(verdict: Verdict, kinds: set) -> Cause | None:
    # Only this key set names a cause: a row that matches attention with a visible key left out can be a
    # wrong temperature on peaked attention just as well (the diagnosis says which; the cause stays numerical).
    keys = [str(f.details.get("keys")) for f in verdict.findings if f.details and f.details.get("keys")]
    if not any("let in" in k for k in keys):
        return None
    return Cause("keys:masked_let_in", "masked-out keys are let in (the output matches attention over them)")


def _nonfinite_alone(verdict: Verdict, kinds: set) -> Cause | None:
    if "nonfinite" not in kinds or "over_budget" in kinds:
        return None
    return Cause(f"nonfinite:{_where(verdict, 'nonfinite')}",
                 f"non-finite {_where(verdict, 'nonfinite')} where the exact result is finite, every finite "
                 "element within its budget (an overflow, or NaN from a masked or empty row)")


def _numerical(verdict: Verdict, kinds: set) -> Cause | None:
    if not kinds & {"over_budget", "nonfinite", "lse"}:
        return None
    where = _where(verdict, "over_budget", "nonfinite")
    return Cause(f"numerical:{where}", f"{where} over the error budget: more error than any legal order of "
                                       "operations in the precision contract gives")


def _neutral_values(features) -> str:
    """The features' neutral values in a few words (each feature's ``neutral_text``): the cap's, the sink's, then
    those of the features that restrict the keys."""
    order = ("cap", "sink", "keys", "bias")
    return ", ".join(f.neutral_text for f in sorted(features, key=lambda f: order.index(f.term)) if f.neutral_text)


def _shifted_biases(features) -> str:
    """The biases the bias shift property shifts (the features with a ``row_shift``)."""
    return " or ".join(f.name for f in features if f.row_shift is not None)


@functools.cache
def _property_causes() -> dict:
    """The properties whose failure no earlier rule names: finding kind -> (key, title). The dense layout
    property's findings never get here (their cause is the layout, above); a layout_dependence finding without
    a layout is the page order's of the forms."""
    # The titles name the features' values; their registry imports torch, which the command line's first
    # process must not load before it starts the kernel's worker: built on first use.
    from ..features.registry import REGISTRY

    return {
        "neutral_variant": ("variant:neutral", f"a declared variant at its neutral value ({_neutral_values(REGISTRY)}) "
                                               "moves the output past its budget, or changes its bits under "
                                               "neutral_variants"),
        "bias_shift_dependence": ("variant:bias_shift", f"a constant added to each row's {_shifted_biases(REGISTRY)} "
                                                        "(the same exact output) moves the output past its budget, or "
                                                        "changes its bits under bias_shift_invariant"),
        "order_dependence": ("variant:order", "a variant written in another order with the same exact answer (each "
                                              "row's index list permuted) moves the output past its budget, or "
                                              "changes its bits where the spec promises order invariance"),
        SCALE_FINDING: SCALE_CAUSE,
        "layout_dependence": ("layout:page_order", "the page pool in another order (the block table renumbered) "
                                                   "changes the output"),
    }


def _property(verdict: Verdict, kinds: set) -> Cause | None:
    return _named_in(_property_causes(), kinds)


def _suspicious(verdict: Verdict, kinds: set) -> Cause | None:
    if verdict.status != SUSPICIOUS:
        return None
    return Cause("suspicious:reordering", "inside the budget but far outside the legal reorderings' envelope (a "
                                          "systematic error, or a kernel outside its precision contract)")


def _where(verdict: Verdict, *kinds: str) -> str:
    """What the findings of ``kinds`` are about: ``out`` (the forward's output and lse) or ``gradients``.
    Which gradients is counted per bug, not part of its cause: one defect in dS shows in dQ on one case
    and in dK on another."""
    backward = any((f.details or {}).get("gradient") for f in verdict.findings if f.kind in kinds)
    return "gradients" if backward else "out"


# A kernel that writes its inputs does so on every case: named so only where nothing else is wrong.
_RULES = (_crash, _hang, _contract, _promise, _poison, _masked_keys_let_in, _nonfinite_alone, _numerical, _property,
          _input_written, _suspicious)
