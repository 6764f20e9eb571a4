"""Merge the JSON summaries of campaigns run side by side (several machines, or ``fuzz --jobs N``).

The merged summary has the keys of one campaign's summary, so whatever reads one reads the other:
counts and times are summed, the largest error/budget per dtype (and per gradient) is kept, findings are concatenated and
tagged with their source, distinct bugs are merged by cause, the verdict is the worst. The campaigns ran at the same time, so the elapsed
time is the longest one and the throughput is the total cases over it. The time to the first judged case
(``first_case_s``) is the earliest one: when the merged campaign had its first result. Case logs are not
merged; each source's log hash stays in ``sources``, with its own counts and its own ``first_case_s``.

A merge in which no case was judged (no cases, or every one skipped) says ``NO_CASES``, never PASS.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path

from ..errors import InvalidArgument
from ..judge.verdict import from_json_number, json_number, run_verdict
from .bugs import merge_bugs
from .result import properties_summary

__all__ = ["load_summary", "merge_summaries", "merged_verdict", "validate_summary"]

_REQUIRED = {"verdict": str, "kernel": (str, list), "device": (str, list), "preset": (str, list), "cases": int,
             "examples": int, "elapsed_s": (int, float), "counts": dict, "findings": list, "stopped": (str, list),
             "time_split_s": dict, "max_ratio_by_dtype": dict, "skipped": dict, "bug_signatures": dict,
             "info": dict, "notes": list, "isolation": (str, list), "timeouts": int, "worker_restarts": int}
_SHARED = ("kernel", "device", "preset")  # a merge of different ones says so in its notes
# Kept as one value, or the list of the different ones. Other keys merge by their type (_merge_values):
# numbers and counts (dicts of numbers) are summed, lists concatenated.
_KEPT = _SHARED + ("seed", "stopped", "isolation", "case_timeout_s", "keep_going", "backward")
# The earliest of the sources' values (None where a source has none).
_EARLIEST = ("first_case_s",)
_FIX = "Pass JSON summaries written by `flashcheck fuzz --json PATH` (or by `flashcheck merge --json`)."


def load_summary(path: str | Path) -> dict:
    """The campaign summary in the JSON file ``path``; :class:`InvalidArgument` naming it if it is not one."""
    try:
        summary = json.loads(Path(path).read_text())
    except OSError as exc:
        raise InvalidArgument("summary", str(path), f"cannot be read ({exc.strerror or exc})", _FIX) from None
    except ValueError as exc:  # not JSON, or not UTF-8 text
        raise InvalidArgument("summary", str(path), f"not JSON ({exc})", _FIX) from None
    validate_summary(summary, str(path))
    return summary


def validate_summary(summary, source: str) -> None:
    """Raise :class:`InvalidArgument` naming ``source`` unless ``summary`` is a flashcheck campaign summary."""
    if not isinstance(summary, dict):
        raise InvalidArgument("summary", source, f"not a flashcheck summary (a JSON {type(summary).__name__}, "
                              "expected an object)", _FIX)
    missing = sorted(k for k in _REQUIRED if k not in summary)
    if missing:
        raise InvalidArgument("summary", source, f"not a flashcheck summary (no {', '.join(missing)})", _FIX)
    wrong = sorted(k for k, t in _REQUIRED.items() if not isinstance(summary[k], t) or isinstance(summary[k], bool))
    if not wrong:  # and inside: one object per finding, one per count
        wrong += ["findings"] if not all(isinstance(f, dict) for f in summary["findings"]) else []
        wrong += ["counts"] if not all(isinstance(c, dict) for c in summary["counts"].values()) else []
    if wrong:
        raise InvalidArgument("summary", source, f"not a flashcheck summary (wrong type of {', '.join(wrong)})", _FIX)


def _judged(summary: dict) -> int:
    return sum(summary["counts"].get("by_status", {}).values())


def merged_verdict(summaries: list[dict]) -> str:
    """The campaign's rule (:func:`flashcheck.judge.verdict.run_verdict`) over several summaries."""
    by_status = _sum_dicts(s["counts"].get("by_status", {}) for s in summaries)
    return run_verdict([f for s in summaries for f in s["findings"]], by_status)


def _sum_dicts(dicts) -> dict:
    total = Counter()
    for d in dicts:
        total.update(d or {})
    return dict(total)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _record_columns(summaries: list[dict], sources: list[str]) -> list:
    """The columns every source's records share; sources whose records have other columns cannot merge."""
    named = [(name, s["record_columns"]) for s, name in zip(summaries, sources) if "record_columns" in s]
    for name, columns in named[1:]:
        if columns != named[0][1]:
            raise InvalidArgument("summary", name, f"its records have the columns {columns}, {named[0][0]}'s "
                                  f"{named[0][1]}", "Merge summaries written by one version of flashcheck.")
    return named[0][1]


def _merge_values(key: str, values: list):
    """The sources' values of a key the merge has no rule for, merged by their type; unknown keys too, so
    that a key added to the campaign's summary is merged without a change here."""
    present = [v for v in values if v is not None]
    if key in _EARLIEST:
        return min((v for v in present if _is_number(v)), default=None)
    if key in _KEPT or not present:
        return _one_or_list(values)
    if all(_is_number(v) for v in present):
        return sum(present)
    if all(isinstance(v, dict) and all(_is_number(x) for x in v.values()) for v in present):
        return _sum_dicts(present)
    if all(isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()) for v in present):
        inner = dict.fromkeys(k for v in present for k in v)  # nested counts (coverage): merged key by key
        return {k: _merge_values(key, [v.get(k) for v in present]) for k in inner}
    if all(isinstance(v, list) for v in present):
        return [x for v in present for x in v]
    return _one_or_list(values)


def _one_or_list(values):
    # The value the sources share, or the distinct values in order (a merged input may hold a list already).
    flat = []
    for v in values:
        for x in (v if isinstance(v, list) else [v]):
            if x not in flat:
                flat.append(x)
    return flat[0] if len(flat) == 1 else flat


def _merged_properties(values: list, elapsed: list):
    """The properties of campaigns that ran side by side: their cases and seconds summed, their share of
    the time over the time they all took (summaries from before the share was kept: as they are)."""
    present = [v for v in values if isinstance(v, dict)]
    if not present or any("cases" not in v for v in present):
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


def _largest_by_gradient(summaries: list[dict]) -> dict:
    """Per dtype, the largest err/budget of each gradient (the backward pass)."""
    per_dtype = [s.get("max_ratio_by_gradient") or {} for s in summaries]
    dtypes = dict.fromkeys(d for inner in per_dtype for d in inner)
    return {d: _largest([inner.get(d) for inner in per_dtype]) for d in dtypes}


def _source_entries(summary: dict, name: str) -> list[dict]:
    if summary.get("sources"):  # an earlier merge: keep its sources, named after it
        return [{**entry, "source": f"{name}/{entry['source']}"} for entry in summary["sources"]]
    elapsed = summary["elapsed_s"]
    return [{"source": name, "kernel": summary["kernel"], "device": summary["device"], "seed": summary.get("seed"),
             "verdict": summary["verdict"], "stopped": summary["stopped"], "cases": summary["cases"],
             "examples": summary["examples"], "judged": _judged(summary), "findings": len(summary["findings"]),
             "elapsed_s": elapsed,
             "cases_per_s": round(summary["cases"] / elapsed, 3) if elapsed > 0 else None,
             "first_case_s": summary.get("first_case_s"),
             "steady_cases_per_s": summary.get("steady_cases_per_s"),
             "case_log_sha256": summary.get("case_log_sha256")}]


def merge_summaries(summaries: list[dict], *, sources: list[str] | None = None) -> dict:
    """One summary from the summaries of campaigns that ran side by side; ``sources`` names each (file
    paths, worker names; default ``summary[i]``). Inputs are not modified."""
    if sources is None:
        sources = [f"summary[{i}]" for i in range(len(summaries))]
    if len(sources) != len(summaries):
        raise InvalidArgument("sources", sources, f"{len(sources)} names for {len(summaries)} summaries",
                              "Pass one name per summary, or none.")
    for summary, name in zip(summaries, sources):
        validate_summary(summary, name)
    keys = list(dict.fromkeys(k for s in summaries for k in s if k != "sources"))
    merged = {key: _merge_values(key, [s.get(key) for s in summaries]) for key in keys}
    notes = [f"these campaigns ran different {key}s: {', '.join(map(str, merged[key]))}"
             for key in _SHARED if isinstance(merged.get(key), list)]
    if "record_columns" in merged:  # one header for the concatenated records, not one per source
        merged["record_columns"] = _record_columns(summaries, sources)
    merged["time_split_s"] = {k: round(v, 3) for k, v in (merged.get("time_split_s") or {}).items()}
    count_keys = dict.fromkeys(["by_status", "by_dtype", "by_regime"] + [k for s in summaries for k in s["counts"]])
    merged["counts"] = {key: _sum_dicts(s["counts"].get(key) for s in summaries) for key in count_keys}
    elapsed = max((s["elapsed_s"] for s in summaries), default=0.0)
    cases = sum(s["cases"] for s in summaries)
    entries = [e for s, name in zip(summaries, sources) for e in _source_entries(s, name)]
    merged.update(
        properties=_merged_properties([s.get("properties") for s in summaries], [s["elapsed_s"] for s in summaries]),
        verdict=merged_verdict(summaries), cases=cases, examples=sum(s["examples"] for s in summaries),
        elapsed_s=elapsed, cases_per_s=round(cases / elapsed, 3) if elapsed > 0 else None,
        max_ratio_by_dtype=_largest([s.get("max_ratio_by_dtype") for s in summaries]),
        max_ratio_by_gradient=_largest_by_gradient(summaries),
        notes=notes + [f"{name}: {n}" for s, name in zip(summaries, sources) for n in s.get("notes") or []],
        findings=[{**f, "source": f"{name}/{f['source']}" if "source" in f else name}
                  for s, name in zip(summaries, sources) for f in s["findings"]],
        bugs=merge_bugs([s.get("bugs") or [] for s in summaries], sources),
        # No merged log; the hash of the sources' hashes, in order, still tells two merges apart.
        case_log=None, case_log_sha256=hashlib.sha256(
            "\n".join(str(e["case_log_sha256"]) for e in entries).encode()).hexdigest(),
        sources=entries,
    )
    # the verdict and the distinct bugs first, as in one campaign's summary
    return {"verdict": merged.pop("verdict"), "bugs": merged.pop("bugs"), **merged}
