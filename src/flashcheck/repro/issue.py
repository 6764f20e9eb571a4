"""The upstream issue's Markdown body: what is wrong in one sentence, the versions, the shrunk case, the worst
elements (expected and actual values, from flashcheck's replay), the defect model the output matches (where the
models describe the bug), and how to run the reproducer. What the issue is about (attention, a serving form's
attention, a merge of partial states) is a :class:`Subject`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..features.forms import form
from ..inputs.serving import ServingCase
from ..judge.verdict import BUG
from .arrays import TensorFile
from .evidence import Evidence

__all__ = ["INLINE_LIMIT", "Subject", "attention_subject", "issue_text", "summary_sentence", "worst_elements"]

INLINE_LIMIT = 40_000  # characters: a larger script is referenced, not inlined (GitHub caps a body at 65,536)
WORST = 5


def worst_elements(evidence: Evidence, count: int = WORST) -> list[tuple]:
    """(tensor, index, expected, got, budget, error/budget) of the worst wrong elements of flashcheck's replay,
    worst first: non-finite where the oracle is finite, or over the budget (rows left to a promise excepted)."""
    rows = []
    for name, c in evidence.tensors.items():
        if c.got is None:
            continue
        got = c.got.detach().to(c.exact.device, torch.float64)
        err = (got - c.exact).abs()
        judged = torch.isfinite(c.exact) & ~torch.isnan(c.budget)
        if c.empty is not None:
            judged &= ~(c.empty if c.empty.dim() == got.dim() else c.empty[..., None].expand_as(got))
        ratio = torch.where(judged & ~torch.isfinite(got), math.inf, err / c.budget)
        ratio = torch.where(judged & ((ratio > 1) | ~torch.isfinite(got)), ratio.nan_to_num(nan=math.inf), 0.0)
        for flat in torch.argsort(ratio.flatten(), descending=True)[:count].tolist():
            r = float(ratio.flatten()[flat])
            if r > 1:
                index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), got.shape))
                rows.append((name, index, float(c.exact[index]), float(got[index]), float(c.budget[index]), r))
    return sorted(rows, key=lambda row: -row[-1])[:count]


def _tensor_of(finding) -> str:
    return (finding.details or {}).get("gradient") or ("lse" if finding.kind == "lse" else "out")


@dataclass
class Subject:
    """What an issue is about, in its words: what is wrong (the headline), the case's lines, the name of the exact
    answer, what each element's budget is, and the heading of the case's lines."""

    wrong: str
    lines: list
    exact: str
    budget: str
    heading: str = "The case (shrunk by flashcheck)"


def attention_subject(case, evidence: Evidence) -> Subject:
    """The subject of an attention case, dense or of a serving form."""
    lines = _serving_lines(case) if isinstance(case, ServingCase) else _case_lines(case, evidence)
    budget = (f"the largest error any legal order of the kernel's floating-point operations can make there "
              f"({case.dtype} inputs, flashcheck's precision contract `{evidence.precision}`)")
    return Subject("wrong attention output on a valid input", lines, "exact attention", budget)


def summary_sentence(kernel: str, evidence: Evidence, exact: str = "exact attention") -> str:
    """What is wrong, in one sentence."""
    f = evidence.finding
    if f is None:
        return (f"`{kernel}` passed flashcheck's replay here ({evidence.verdict.status}), though the case was saved "
                "as a failure.")
    name = _tensor_of(f)
    if f.kind == "over_budget":
        over = (f.details or {}).get("elements_over")
        count = f"{over} {name} elements" if over else f"{name} elements"
        return (f"`{kernel}` returns {count} farther from {exact} than any legal reordering of its "
                f"floating-point operations allows (worst: {f.ratio:.3g} times the element's error budget).")
    if f.kind == "nonfinite":
        return f"`{kernel}` returns non-finite {name} values (NaN or infinity) where {exact} is finite."
    if f.kind == "crash":
        return f"`{kernel}` raises on a valid input: {f.diagnosis}"
    return f"`{kernel}`: {f.diagnosis}"


def _case_lines(case, evidence: Evidence) -> list[str]:
    s, p = case.shapes, case.provenance or {}
    q, k, v, _ = case.to_device("cpu")
    layout = ", ".join(f"{n} strides {tuple(t.stride())} offset {t.storage_offset()}" for n, t in zip("qkv", (q, k, v)))
    mask = "none" if case.attn_mask is None else (
        f"boolean {tuple(case.attn_mask.shape)}, {int(case.attn_mask.sum())} of {case.attn_mask.numel()} True")
    lines = [f"- shapes: q {tuple(case.q.shape)}, k {tuple(case.k.shape)}, v {tuple(case.v.shape)} "
             f"(B={s.batch}, Hq={s.heads_q}, Hkv={s.heads_kv}, Nq={s.n_q}, Nk={s.n_k}, D={s.head_dim}, "
             f"Dv={s.head_dim_v})",
             f"- dtype: {case.dtype}; scale: {case.scale!r} (`{case.scale.hex()}`)",
             f"- causal: {case.causal}; attn_mask: {mask}",
             f"- layout: {case.layout} ({layout})"]
    if case.variant.used:
        lines.append(f"- variant: {case.variant.describe()}")
    lines.append(f"- regime: {p.get('strategy') or 'unknown'}; seed: {p.get('seed')}")
    if evidence.backward:
        lines.append(f"- backward pass: dO regime {p.get('upstream')}, seed {p.get('upstream_seed')} "
                     f"(dO itself is in `{TensorFile.NAME}`)")
    return lines


def _worst_table(evidence: Evidence) -> list[str]:
    rows = worst_elements(evidence)
    if not rows:
        return ["No element over its budget in flashcheck's replay here (see the diagnosis above)."]
    out = ["| tensor | index | expected (exact) | got | budget | error / budget |", "|---|---|---|---|---|---|"]
    out += [f"| {n} | {list(i)} | {e:.9g} | {g:.9g} | {b:.3g} | {r:.3g} |" for n, i, e, g, b, r in rows]
    return out


def _serving_lines(case: ServingCase) -> list[str]:
    physical, p = case.physical("cpu"), case.provenance or {}
    names = form(case.form).tensors
    keywords = ", ".join(f"{n}={v.tolist() if v.numel() <= 16 else tuple(v.shape)}" if hasattr(v, "tolist")
                         else f"{n}={v}" for n, v in physical.kwargs.items())
    lines = [f"- form: {case.form}; " + ", ".join(f"{n} {tuple(t.shape)}" for n, t in zip(names, physical.tensors)),
             f"- {keywords}",
             f"- per sequence: q_lens {list(case.q_lens)}, k_lens {list(case.k_lens)}"
             + form(case.form).text(case)
             + f"; memory no sequence owns holds {case.poison} poison",
             f"- dtype: {case.dtype}; scale: {case.scale!r} (`{case.scale.hex()}`); causal: {case.causal} (per "
             "sequence, on its own lengths)"]
    if case.variant.used:
        lines.append(f"- variant: {case.variant.describe()}")
    return lines + [f"- regime: {p.get('strategy') or 'unknown'}; seed: {p.get('seed')}"]


def _reproducer(script: str) -> list[str]:
    where = (f"the inputs (layout included) and each element's budget are in `{TensorFile.NAME}` beside it, bit for "
             "bit: attach both files (the script checks the file's SHA-256).")
    parts = ["## Reproducer", "", f"`repro.py` needs only torch and the kernel's package; {where}", "", "```text",
             "python repro.py            # exit 1: reproduced, 0: not reproduced, 2: cannot run here",
             "python repro.py --device cpu", "```", ""]
    if len(script) <= INLINE_LIMIT:
        return parts + ["<details><summary>repro.py</summary>", "", "```python", script.rstrip("\n"), "```", "",
                        "</details>", ""]
    return parts + [f"The script ({len(script):,} characters) is attached as `repro.py`.", ""]


def _model_section(model) -> list[str]:
    """The defect models' line and the fit of each model that explains the bug (``model``: an
    :class:`~flashcheck.defects.Explanation`; None: the models do not describe this bug, no section)."""
    if model is None:
        return []
    parts = ["## Defect model", "", "flashcheck matched the kernel's output against its defect models, each a known "
             "numerical mistake committed by a precision-faithful copy of the algorithm:", "", f"> {model.line()}", ""]
    if not model.fits:
        return parts
    parts += ["| model | err/budget against the model | within one budget | the model against the oracle |",
              "|---|---|---|---|"]
    parts += [f"| {f.name} | {'bitwise' if f.bitwise else f'{f.fit:.3g}'} | {f.within:.0%} | {f.model_ratio:.3g} |"
              for f in model.fits]
    return parts + [""]


def issue_text(subject: Subject, evidence: Evidence, *, kernel: str, versions: dict, script: str,
               device: str, model=None) -> str:
    """The issue body about ``subject`` (``script``: the reproducer's text, inlined when small enough; ``model``: the
    defect models' explanation, where they describe the bug)."""
    v = evidence.verdict
    parts = [f"# {kernel}: {subject.wrong}" if evidence.finding else f"# {kernel}",
             "", summary_sentence(kernel, evidence, subject.exact), ""]
    if v.status != BUG:
        parts += [f"> **Note:** flashcheck's replay on this machine ({device}) gives {v.status}, not BUG. The "
                  "defect may need the GPU (or the settings) it was found with; the reproducer was written anyway.",
                  ""]
    parts += ["## Versions", "", "Recorded when the reproducer was generated (the script prints those of the "
              "machine that runs it):", "", "| | |", "|---|---|"]
    parts += [f"| {key} | {value} |" for key, value in versions.items()]
    parts += ["", f"## {subject.heading}", "", *subject.lines, "",
              "## What is wrong", "", f"flashcheck's diagnosis: `{evidence.diagnosis}`", "",
              f"An element is wrong when it is non-finite where {subject.exact} is finite, or farther from the exact "
              f"(float64) value than its error budget: {subject.budget}.", "", *_worst_table(evidence), ""]
    if evidence.unchecked:
        parts += [f"flashcheck also found {', '.join(evidence.unchecked)}: properties of reruns (poisoned memory, "
                  "other layouts, repeated calls) that the reproducer does not check.", ""]
    return "\n".join(parts + _model_section(model) + _reproducer(script))
