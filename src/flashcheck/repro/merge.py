"""``flashcheck repro`` of a saved merge case (:mod:`flashcheck.inputs.merge_case`): the states replayed on the merge
as :func:`flashcheck.check_merge` judges them (:func:`~flashcheck.judge.merge.judge_merge`), a script that calls
the merge on them (folded pairwise for a two-state merge) and compares with the exact merge and each element's
budget, its tensors in the file beside it, and the issue body."""

from __future__ import annotations

import os

from ..contract.formats import device_named
from ..errors import InvalidArgument
from ..inputs.merge_case import MergeCase
from ..judge.merge import judge_merge
from ..judge.verdict import Verdict
from ..kernels.names import import_target
from ..kernels.origin import importable_from
from . import Repro
from .arrays import TensorFile
from .calls import plain_target
from .evidence import Compared, Evidence
from .issue import Subject, issue_text, summary_sentence
from .script import copied, generated_versions, script_frame, script_text, with_tensor_file

__all__ = ["merge_repro"]

EXACT = "the exact merge"


def _merge_kernel(case: MergeCase, override: str | None, case_path):
    """The merge as a kernel object: ``override`` (an import path), else the one the states were saved with."""
    fix = "Pass --kernel module:function, the merge's import path."
    if override is not None and ":" not in override:
        raise InvalidArgument("--kernel", override, "not an import path", fix)
    source = override or case.provenance.get("merge_source")
    if not source or ":" not in source:
        raise InvalidArgument("CASE", str(case_path), "the saved states name no import path of their merge (it was "
                              "defined inside a function or in __main__)", fix)
    importable_from([os.getcwd(), case.provenance.get("merge_import_root")])
    return import_target(source), source


def _evidence(fn, case: MergeCase, device) -> Evidence:
    s = case.outs.shape[0]
    where = f"{case.provenance.get('regime', 'saved')} S={s}"
    judged = judge_merge(fn, case.outs, case.lses, case.conventions, device=device, where=where)
    verdict = Verdict.from_findings(judged.findings, max_ratio=judged.ratio, case=case.describe(),
                                    kernel=getattr(fn, "__name__", repr(fn)))
    b, conventions = judged.budget, case.conventions
    tensors = {"out": Compared(judged.out, b.out, b.out_tol, b.empty),
               "lse": Compared(judged.lse, b.lse, b.lse_tol, b.empty)}
    return Evidence(verdict, False, tensors, promises={"out": "zero", "lse": conventions.empty_lse},
                    lse_base=conventions.lse_base, precision="merge")


def _data(case: MergeCase, evidence: Evidence, tensors: TensorFile, frame: dict) -> dict:
    """The script's ``CASE``: the states as the merge got them and the budgets, their bits in ``tensors``."""
    _, r, dv = case.outs.shape
    return {**frame, "inputs": {n: tensors.encode(getattr(case, n), f"inputs.{n}") for n in ("outs", "lses")},
            "merge": case.conventions.as_dict(), "shapes": {"out": [r, dv]},
            "budgets": {n: tensors.encode(copied(c.budget), f"budgets.{n}") for n, c in evidence.tensors.items()},
            "empty_rows": evidence.promises, "lse_base": evidence.lse_base, "indices": {"out": "[r, k]", "lse": "[r]"}}


def _subject(case: MergeCase) -> Subject:
    c, (s, r, dv) = case.conventions, case.outs.shape
    call = f"`{c.signature}`" + (", folded pairwise, ((s1 + s2) + s3) + ..., each result passed on in the states' "
                                 "dtype" if c.pairwise else "")
    lines = [f"- states: {s} partial outputs of {r} rows of {dv} ({case.dtype}) and their lse (fp32, base "
             f"{c.lse_base}, -inf for a state that saw no key); regime {case.provenance.get('regime')}",
             f"- the call: {call}", f"- a row whose states are all empty must give out 0 and lse {c.empty_lse}"]
    budget = ("the largest error a legal merge can make there (fp32 arithmetic, weights relative to the largest "
              "lse, the out rounded to its dtype " + ("at each call)" if c.pairwise else "once)"))
    return Subject("wrong merge of partial attention states", lines, EXACT, budget,
                   heading="The states (drawn by flashcheck.check_merge)")


def merge_repro(case: MergeCase, *, merge: str | None, device: str, case_path) -> Repro:
    """The reproducer and the issue for the saved states ``case`` on its merge (or ``merge``) on ``device``."""
    kernel, source = _merge_kernel(case, merge, case_path)
    call = plain_target(kernel, source, case_path)
    evidence = _evidence(kernel.fn, case, device_named(device))
    versions = generated_versions(call, device)
    title = f"Reproducer: {summary_sentence(source, evidence, EXACT)}".replace("`", "")
    tensors = TensorFile()
    data = _data(case, evidence, tensors, script_frame(call, evidence, describe=case.describe(), device=device,
                                                       title=title, versions=versions))
    content = with_tensor_file(data, tensors)
    script = script_text(data, form="merge")
    issue = issue_text(_subject(case), evidence, kernel=source, versions=versions, script=script, device=device)
    return Repro(script, issue, evidence, content)
