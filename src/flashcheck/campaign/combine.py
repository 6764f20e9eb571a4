"""Combine the summaries of campaigns run side by side (several machines, or ``fuzz --jobs N``) into one:
what ``flashcheck merge`` writes.

The combined summary has the keys of one campaign's summary, so whatever reads one reads the other:
counts and times are summed, the largest error/budget per dtype (and per gradient) is kept, findings are
concatenated and tagged with their source, distinct bugs are combined by cause, the verdict is the worst.
The campaigns ran at the same time, so the elapsed time is the longest one and the throughput is the total
cases over it. The time to the first judged case (``first_case_s``) is the earliest one: when the combined
campaign had its first result. Case logs are not combined; each source's log hash stays in ``sources``,
with its own counts and its own ``first_case_s``. A key this version does not know is combined by its
type: numbers and counts (dicts of numbers) summed, lists concatenated, anything else kept.

A combination in which no case was judged (no cases, or every one skipped) says ``NO_CASES``, never PASS.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter

from ..errors import InvalidArgument
from ..judge.verdict import from_json_number, json_number, run_verdict
from .bugs import combine_bugs
from .result import properties_summary
from .summary import CampaignSummary, add_quantization_error

__all__ = ["combine_summaries", "combined_verdict"]

_SHARED = ("kernel", "device", "preset")  # a combination of different ones says so in its notes
# Kept as one value, or the list of the different ones.
_KEPT = _SHARED + ("seed", "stopped", "isolation", "case_timeout_s", "keep_going", "backward")
# Combined by their type, as keys this version does not know.
_BY_TYPE = ("steady_cases_per_s", "compilations", "timeouts", "worker_restarts", "skipped", "skipped_reasons",
            "bug_signatures", "info", "coverage", "records", "jobs", "lost")
# Written whatever the sources held.
_ALWAYS = frozenset(("verdict", "bugs", "cases", "examples", "elapsed_s", "cases_per_s", "time_split_s", "counts",
                     "max_ratio_by_dtype", "max_ratio_by_gradient", "properties", "notes", "findings", "case_log",
                     "case_log_sha256", "sources"))


def _quantization(errors: list) -> dict | None:
    """Sampled quantization errors combined, dtype by dtype: cases summed, the least cosine, the largest error."""
    out: dict = {}
    for by_dtype in errors:
        for dtype, e in (by_dtype or {}).items():
            add_quantization_error(out, dtype, **e)
    return out or None


def combined_verdict(summaries: list[CampaignSummary]) -> str:
    """The campaign's rule (:func:`flashcheck.judge.verdict.run_verdict`) over several summaries."""
    by_status = _sum_dicts(s.counts.get("by_status", {}) for s in summaries)
    return run_verdict([f for s in summaries for f in s.findings], by_status)


def _sum_dicts(dicts) -> dict:
    total = Counter()
    for d in dicts:
        total.update(d or {})
    return dict(total)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _record_columns(summaries: list[CampaignSummary], sources: list[str]) -> list | None:
    """The columns every source's records share; sources whose records have other columns cannot combine."""
    named = [(name, s.record_columns) for s, name in zip(summaries, sources) if s.record_columns is not None]
    for name, columns in named[1:]:
        if columns != named[0][1]:
            raise InvalidArgument("summary", name, f"its records have the columns {columns}, {named[0][0]}'s "
                                  f"{named[0][1]}", "Merge summaries written by one version of flashcheck.")
    return named[0][1] if named else None


def _by_type(values: list):
    """The sources' values of one key, combined by their type (None: a source without the key)."""
    present = [v for v in values if v is not None]
    if not present:
        return _one_or_list(values)
    if all(_is_number(v) for v in present):
        return sum(present)
    if all(isinstance(v, dict) and all(_is_number(x) for x in v.values()) for v in present):
        return _sum_dicts(present)
    if all(isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()) for v in present):
        inner = dict.fromkeys(k for v in present for k in v)  # nested counts (coverage): combined key by key
        return {k: _by_type([v.get(k) for v in present]) for k in inner}
    if all(isinstance(v, list) for v in present):
        return [x for v in present for x in v]
    return _one_or_list(values)


def _one_or_list(values):
    # The value the sources share, or the distinct values in order (a combined input may hold a list already).
    flat = []
    for v in values:
        for x in (v if isinstance(v, list) else [v]):
            if x not in flat:
                flat.append(x)
    return flat[0] if len(flat) == 1 else flat


def _earliest(values: list):
    return min((v for v in values if _is_number(v)), default=None)


def _combined_properties(values: list, elapsed: list):
    """The properties of campaigns that ran side by side: their cases and seconds summed, their share of
    the time over the time they all took (summaries from before the share was kept: as they are)."""
    # A campaign that checked none (a worker that ended before its first case) has nothing to add.
    present = [v for v in values if isinstance(v, dict) and (v.get("checked") or "cases" in v)]
    if not present:
        return next((v for v in values if isinstance(v, dict)), _one_or_list(values))
    if any("cases" not in v for v in present):
        return _one_or_list(values)
    seconds = sum(v.get("seconds") or 0.0 for v in present)
    names = list(dict.fromkeys(name for v in present for name in v["checked"]))  # the union, in order
    return properties_summary(names, present[0]["share"], _sum_dicts(v["cases"] for v in present), seconds,
                              sum(elapsed))


def _largest(ratios: list) -> dict:
    """The largest err/budget of each key of ``ratios`` (dicts of JSON numbers); NaN is the worst."""
    out: dict = {}
    for inner in ratios:
        for key, ratio in (inner or {}).items():
            ratio, prev = from_json_number(ratio), out.get(key)
            out[key] = ratio if prev is None or math.isnan(ratio) or ratio > prev else prev
    return {k: json_number(v) for k, v in out.items()}


def _largest_by_gradient(summaries: list[CampaignSummary]) -> dict:
    """Per dtype, the largest err/budget of each gradient (the backward pass)."""
    per_dtype = [s.max_ratio_by_gradient or {} for s in summaries]
    dtypes = dict.fromkeys(d for inner in per_dtype for d in inner)
    return {d: _largest([inner.get(d) for inner in per_dtype]) for d in dtypes}


def _source_entries(summary: CampaignSummary, name: str) -> list[dict]:
    if summary.sources:  # an earlier combination: keep its sources, named after it
        return [{**entry, "source": f"{name}/{entry['source']}"} for entry in summary.sources]
    elapsed = summary.elapsed_s
    return [{"source": name, "kernel": summary.kernel, "device": summary.device, "seed": summary.seed,
             "verdict": summary.verdict, "stopped": summary.stopped, "cases": summary.cases,
             "examples": summary.examples, "judged": summary.judged, "findings": len(summary.findings),
             "elapsed_s": elapsed,
             "cases_per_s": round(summary.cases / elapsed, 3) if elapsed > 0 else None,
             "first_case_s": summary.first_case_s,
             "steady_cases_per_s": summary.steady_cases_per_s,
             "case_log_sha256": summary.case_log_sha256}]


def _counts(summaries: list[CampaignSummary]) -> dict:
    keys = dict.fromkeys(["by_status", "by_dtype", "by_regime"] + [k for s in summaries for k in s.counts])
    return {key: _sum_dicts(s.counts.get(key) for s in summaries) for key in keys}


def _extra(summaries: list[CampaignSummary]) -> dict:
    keys = dict.fromkeys(k for s in summaries for k in s.extra)
    return {key: _by_type([s.extra.get(key) for s in summaries]) for key in keys}


def combine_summaries(summaries: list[CampaignSummary], *, sources: list[str] | None = None) -> CampaignSummary:
    """One summary from the summaries of campaigns that ran side by side; ``sources`` names each (file
    paths, worker names; default ``summary[i]``). Inputs are not modified."""
    if sources is None:
        sources = [f"summary[{i}]" for i in range(len(summaries))]
    if len(sources) != len(summaries):
        raise InvalidArgument("sources", sources, f"{len(sources)} names for {len(summaries)} summaries",
                              "Pass one name per summary, or none.")
    each = {key: [getattr(s, key) for s in summaries] for key in _KEPT + _BY_TYPE + ("first_case_s",)}
    kept = {key: _one_or_list(each[key]) for key in _KEPT}
    notes = [f"these campaigns ran different {key}s: {', '.join(map(str, kept[key]))}"
             for key in _SHARED if isinstance(kept[key], list)]
    elapsed = max((s.elapsed_s for s in summaries), default=0.0)
    cases = sum(s.cases for s in summaries)
    entries = [e for s, name in zip(summaries, sources) for e in _source_entries(s, name)]
    absent = frozenset.intersection(*(s.absent for s in summaries)) if summaries else \
        frozenset(f.name for f in CampaignSummary.__dataclass_fields__.values())
    return CampaignSummary(
        **kept, **{key: _by_type(each[key]) for key in _BY_TYPE}, first_case_s=_earliest(each["first_case_s"]),
        verdict=combined_verdict(summaries), bugs=combine_bugs([s.bugs or [] for s in summaries], sources),
        cases=cases, examples=sum(s.examples for s in summaries), elapsed_s=elapsed,
        cases_per_s=round(cases / elapsed, 3) if elapsed > 0 else None,
        time_split_s={k: round(v, 3) for k, v in _by_type([s.time_split_s for s in summaries] or [{}]).items()},
        counts=_counts(summaries),
        max_ratio_by_dtype=_largest([s.max_ratio_by_dtype for s in summaries]),
        max_ratio_by_gradient=_largest_by_gradient(summaries),
        quantization_error=_quantization([s.quantization_error for s in summaries]),
        properties=_combined_properties([s.properties for s in summaries], [s.elapsed_s for s in summaries]),
        notes=notes + [f"{name}: {n}" for s, name in zip(summaries, sources) for n in s.notes or []],
        findings=[{**f, "source": f"{name}/{f['source']}" if "source" in f else name}
                  for s, name in zip(summaries, sources) for f in s.findings],
        # No combined log; the hash of the sources' hashes, in order, still tells two combinations apart.
        case_log=None, case_log_sha256=hashlib.sha256(
            "\n".join(str(e["case_log_sha256"]) for e in entries).encode()).hexdigest(),
        record_columns=_record_columns(summaries, sources), sources=entries, extra=_extra(summaries),
        absent=absent - _ALWAYS)
