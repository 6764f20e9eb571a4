"""Upstream bug reports from saved cases: a reproducer script (torch and the kernel's package, no flashcheck) with
the case's tensors in a file beside it, and a Markdown issue body, as ``flashcheck repro CASE --out DIR`` writes
them. A saved merge case's are written by :mod:`.merge`.

:func:`make_repro` replays the case (:mod:`.evidence`), names the defect model its output matches
(:mod:`flashcheck.defects`), decides how the script calls the kernel (:mod:`.calls`), fills the script template
(:mod:`.script`, with the arrays of :mod:`.arrays`) and writes the issue (:mod:`.issue`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Repro", "make_repro"]


@dataclass
class Repro:
    script: str  # repro.py
    issue: str  # ISSUE.md
    evidence: object  # flashcheck's replay (:class:`flashcheck.repro.evidence.Evidence`)
    tensors: bytes  # the tensors file beside the script (repro.npz)
    model: object = None  # the defect models' explanation (flashcheck.defects.Explanation), where they describe it

    @property
    def verdict(self):
        return self.evidence.verdict


def make_repro(kernel, case, *, device: str, case_path) -> Repro:
    """The reproducer and the issue for ``case`` (dense or of a serving form) on ``kernel`` (a resolved
    :class:`~flashcheck.contract.spec.Kernel`) replayed on ``device``; InvalidArgument naming the case for a kernel
    or case it cannot write."""
    # Imported here: the package's name (Repro) stays importable without torch.
    from ..defects.naming import explained_verdict
    from ..inputs.serving import ServingCase
    from .arrays import TensorFile
    from .calls import kernel_call
    from .evidence import gather
    from .issue import attention_subject, issue_text, summary_sentence
    from .script import generated_versions, script_data, script_text, serving_data, with_tensor_file

    call = kernel_call(kernel, case, device=device, case_path=case_path)  # refuses before anything runs
    evidence = gather(kernel, case, device=device)
    model = explained_verdict(kernel, case, evidence.verdict, device=device)
    versions = generated_versions(call, device)
    name = kernel.name
    title = f"Reproducer: {summary_sentence(name, evidence)}".replace("`", "")
    serving = isinstance(case, ServingCase)
    tensors = TensorFile()
    data = (serving_data if serving else script_data)(case, call, evidence, tensors, device=device, title=title,
                                                      versions=versions)
    content = with_tensor_file(data, tensors)
    script = script_text(data, form="serving" if serving else "dense", variant=case.variant)
    subject = attention_subject(case, evidence)
    issue = issue_text(subject, evidence, kernel=name, versions=versions, script=script, device=device, model=model)
    return Repro(script, issue, evidence, content, model)

