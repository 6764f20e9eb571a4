"""The corpus: every failing case saved the moment it is found, as a case file named after its kernel,
its finding kinds and a hash of its recipe, with the verdict and how to reach the kernel again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..inputs.case import AttentionCase
from ..judge.verdict import Verdict
from ..kernels.origin import kernel_origin

__all__ = ["save_finding", "signature"]


def _slug(text: str, limit: int = 60) -> str:
    """``text`` as a file-name part of at most ``limit`` characters, cut between words, never inside one
    (``flashcheck-triton-block_m-32-block_n-32``); a cut name ends with a hash of the whole."""
    slug = "-".join(filter(None, "".join(c if c.isalnum() or c in "_." else "-" for c in text).split("-")))
    if len(slug) <= limit:
        return slug
    digest = hashlib.sha1(text.encode()).hexdigest()[:6]
    words, kept = slug.split("-"), ""
    for word in words:
        if len(kept) + len(word) + 1 > limit - len(digest) - 1:
            break
        kept = f"{kept}-{word}" if kept else word
    return f"{kept}-{digest}" if kept else digest


def signature(verdict: Verdict) -> str:
    """The sorted kinds of a verdict's findings (``crash``, ``over_budget+poison_leak``, ...): part of a
    saved case's file name. Distinct bugs are told apart by cause (:func:`flashcheck.campaign.causes.root_cause`)."""
    return "+".join(sorted({f.kind for f in verdict.findings})) or verdict.status.lower()


def save_finding(corpus: Path, verdict: Verdict, case: AttentionCase, *, label: str, kernel=None) -> Path:
    """Save a failing case under ``corpus`` with its verdict, and how to reach ``kernel`` again (its
    source and import folder, apart from its display name); returns the JSON path."""
    kinds = signature(verdict)
    digest = hashlib.sha1(json.dumps(case.provenance.get("recipe", case.describe()), sort_keys=True,
                                     default=str).encode()).hexdigest()[:10]
    stem = corpus / f"{_slug(verdict.kernel)}-{kinds}-{label}-{digest}"
    provenance = dict(case.provenance)
    provenance["verdict"] = verdict.as_dict()
    if kernel is not None:
        provenance.update(kernel_origin(kernel))
    saved = case.with_provenance(provenance)
    _, json_path = saved.save(stem)
    return json_path
