"""A campaign's summary for people: what ``fuzz`` prints at its end and ``merge`` prints for the summaries
it combined (a :class:`~flashcheck.campaign.summary.CampaignSummary`'s JSON, or the combined one of ``--jobs``)."""

from __future__ import annotations

import re

from ..campaign.result import never_judged, shrink_state
from ..words import SHOWN, counted, listed, wrapped

__all__ = ["print_summary"]


def _text(value) -> str:
    # A value that combined campaigns share, or their different values.
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def print_summary(d: dict, json_path: str | None = None) -> None:
    """A campaign's summary (a ``CampaignSummary``'s JSON, or the combined one of ``--jobs``), for people;
    ``json_path``: where the JSON summary goes (``--json``), which keeps what the console leaves out."""
    print(f"flashcheck fuzz {_text(d['kernel'])} on {_text(d['device'])} (preset {_text(d['preset'])})"
          f"{_pass(d.get('backward'))}: {d['verdict']}")
    first = f", first judged case {_text(d['first_case_s'])} s after start" if d.get("first_case_s") is not None else ""
    print(f"  {d['cases']} cases in {d['elapsed_s']} s ({d['cases_per_s']} cases/s){first}, "
          f"stopped: {_text(d['stopped'])}")
    if d["cases"] != d["examples"]:
        print(f"  {d['examples']} cases drawn, {d['cases'] - d['examples']} tried while shrinking")
    print(f"  time: {_time_split(d['time_split_s'], d.get('compilations', 0))}")
    isolation = _text(d["isolation"])
    if isolation == "worker":
        isolation += (f" process, case timeout {_text(d['case_timeout_s'])} s, {d['worker_restarts']} restarts, "
                      f"{d['timeouts']} timeouts")
    print(f"  kernel ran: {isolation}")
    for source in d.get("sources") or []:  # one per --jobs worker
        gpu = f" (GPU {source['gpu']})" if source.get("gpu") not in (None, "ray") else ""
        ended = f", ended: {source['exit']}" if source.get("exit") else ""
        node = f", on node {source['node'][:8]}" if source.get("node") else ""
        print(f"  {source['source']}{gpu}: {source['verdict']}, {source['cases']} cases, {source['findings']} "
              f"findings, stopped: {source.get('stopped')}{ended}{node}")
    for lost in d.get("lost") or []:
        print(wrapped(f"  lost: {_lost(lost)}"))
    info = d["info"]
    if info.get("batch_checked"):
        print(f"  batch invariance (information): {info['batch_dependent']} of {info['batch_checked']} "
              "batched cases gave other bits for a sequence run alone")
    _print_skipped(d)
    by_gradient = d.get("max_ratio_by_gradient") or {}
    for dtype, ratio in sorted(d["max_ratio_by_dtype"].items()):
        print(f"  {dtype}: {d['counts']['by_dtype'].get(dtype, 0)} cases, max error/budget {float(ratio):.3g}"
              f"{_gradients(by_gradient.get(dtype))}")
    for dtype, e in sorted((d.get("quantization_error") or {}).items()):
        print(f"  {dtype} quantization error (the inputs' against their full-precision values, {e['cases']} cases "
              f"sampled; not judged): cosine at least {e['min_cosine']:.6f}, max |dO| at most {e['max_rel']:.3g} of "
              "max |O|")
    _print_coverage(d.get("coverage") or {})
    _print_properties(d.get("properties") or {})
    _print_bugs(d.get("bugs") or [])
    for note in d["notes"]:
        print(f"  note: {note}")
    _print_findings(d["findings"], json_path)


def _lost(lost: dict) -> str:
    """A worker that ended before its share was done, and what became of the rest of it."""
    what = f"{lost['worker']} after {counted(lost['cases'], 'case')} ({lost['drawn']} drawn): {lost['ended']}"
    if lost["restarted_as"] is None:
        return f"{what}; not restarted: {lost['not_restarted']}"
    left = lost["left"]
    seconds = f" and {left['seconds']:.0f} s" if left.get("seconds") is not None else ""
    return f"{what}; its {counted(left['cases'], 'case')}{seconds} left went to {lost['restarted_as']}"


def _print_findings(findings: list, json_path: str | None) -> None:
    """The first raw findings (each saved case), and where the others are."""
    if findings:
        print(f"  raw findings ({len(findings)}, each saved case):")
    for f in findings[:SHOWN]:
        state = shrink_state(f)
        source = f", {f['source']}" if "source" in f else ""
        print(f"  {f['status']} {'+'.join(f['kinds'])} ({state}{source}): {f['case']}")
        for line in _by_split_count(f["diagnosis"]):
            print(f"      {line}")
        print(f"      replay: {f['replay']}")
    if len(findings) > SHOWN:
        where = f"see {json_path}" if json_path else "each case is in the corpus; --json PATH writes them all"
        print(f"  and {counted(len(findings) - SHOWN, 'more finding')}: {where}")


_AT_SPLITS = re.compile(r"num_splits=(\d+): (.*)", re.S)


def _by_split_count(lines: list) -> list:
    """Diagnosis lines, those of a split-KV kernel that agree at several split counts as one
    (``num_splits 1, 2, 3, 8: ...``), where the first of them was."""
    groups: dict = {}  # the line after its split count (or the line's place) -> its split counts, in order
    for i, line in enumerate(lines):
        at = _AT_SPLITS.fullmatch(line)
        groups.setdefault(at[2] if at else i, []).append(at[1] if at else line)
    return [_at_split_counts(key, counts) if isinstance(key, str) else counts[0] for key, counts in groups.items()]


def _at_split_counts(rest: str, counts: list) -> str:
    return f"num_splits={counts[0]}: {rest}" if len(counts) == 1 else f"num_splits {', '.join(counts)}: {rest}"


def _pass(backward) -> str:
    """The pass a campaign checked, when it is the backward (a combination of both: both)."""
    if backward is True:
        return ", backward pass"
    return ", forward and backward passes" if isinstance(backward, list) and True in backward else ""


def _gradients(ratios: dict | None) -> str:
    """`` (dq 0.5, dk 0.25, dv 0.75)``: the largest err/budget of each gradient, in the campaign's order."""
    return " (" + ", ".join(f"{k} {float(v):.3g}" for k, v in ratios.items()) + ")" if ratios else ""


def _print_coverage(coverage: dict) -> None:
    """How many values of each field the drawn cases were judged with, over all dtypes, and per dtype
    the values never judged (a sign-off cell is one dtype)."""
    total: dict = {}
    for fields in coverage.values():
        for name, counts in fields.items():
            if name != "dtype":
                inner = total.setdefault(name, {})
                for value, n in counts.items():
                    inner[value] = inner.get(value, 0) + n
    if not total:
        return
    seen = ", ".join(f"{name} {sum(1 for n in c.values() if n)}/{len(c)}" for name, c in total.items() if c)
    missing = never_judged(total)
    print(wrapped(f"  coverage (judged cases): {seen}" + (f"; never judged: {listed(missing)}" if missing else "")))
    for dtype, fields in sorted(coverage.items()):
        if len(coverage) > 1 and (missing := never_judged(fields)):
            print(wrapped(f"    never judged in {dtype}: {listed(missing)}"))


def _print_properties(properties: dict | list) -> None:
    if not isinstance(properties, dict):  # summaries merged from before the share was kept: one per source
        return
    cases = properties.get("cases")
    if not properties.get("checked") or cases is None:
        return
    share = properties.get("time_share")
    spent = f", {100 * share:.0f}% of the time" if isinstance(share, (int, float)) else ""
    judged = ", ".join(f"{name} {cases.get(name, 0)}" for name in properties["checked"])
    print(wrapped(f"  exact properties (within {100 * properties.get('share', 0):.0f}% of the time{spent}): "
                  f"cases judged: {judged}"))


def _counts(counts: dict) -> str:
    """The most frequent values with their counts, and how many more there are."""
    return listed(f"{k} {n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _print_bugs(bugs: list) -> None:
    """The distinct bugs, first: what a reader acts on (one per root cause, with its smallest case)."""
    if not bugs:
        return
    print(f"  distinct bugs: {len(bugs)}")
    for bug in bugs:
        print(f"  #{bug['id']} {bug['status']} [{bug['cause']}] {bug['title']}")
        shrink = f" (+{bug['shrink_cases']} met while shrinking another)" if bug.get("shrink_cases") else ""
        print(wrapped(f"      {bug['cases']} drawn cases{shrink}, max error/budget {_text(bug['max_ratio'])}; "
                      f"dtypes: {_counts(bug['dtypes'])}; layouts: {_counts(bug['layouts'])}; causal: "
                      f"{_counts(bug['causal'])}; where: {_counts(bug.get('parts') or {})}"))
        print(wrapped(f"      regimes: {_counts(bug['regimes'])}"))
        smallest = bug.get("smallest")
        if smallest:
            print(f"      smallest case ({shrink_state(smallest)}): {smallest['case']}")
            for line in _by_split_count(bug["diagnosis"]):
                print(f"        {line}")
            if bug.get("model"):  # the defect models' line on that case
                print(wrapped(f"      {bug['model']['line']}"))
            print(f"      replay: {smallest['replay']}")


def _time_split(split: dict, compilations: int) -> str:
    # Compilation time is part of the kernel's: shown inside it, not beside it.
    parts = []
    for part, seconds in split.items():
        if part == "kernel" and (compilations or split.get("compile")):
            parts.append(f"kernel {seconds:.2f} s (compiling {split.get('compile', 0.0):.2f} s of it, "
                         f"{compilations} compilations)")
        elif part != "compile":
            parts.append(f"{part} {seconds:.2f} s")
    return ", ".join(parts)


def _print_skipped(d: dict) -> None:
    skipped = sum(d["skipped"].values())
    if not skipped:
        return
    why = ", ".join(f"{n} {'out of memory' if k == 'oom' else k}" for k, n in d["skipped"].items() if n)
    print(f"  skipped (not judged): {skipped} cases ({why})")
    for reason, n in sorted((d.get("skipped_reasons") or {}).items(), key=lambda kv: -kv[1]):
        print(f"      {n} x {reason}")

