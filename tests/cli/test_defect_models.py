"""The defect models name a campaign's distinct numerical bug once, on its smallest case after shrinking, in the
kernel's worker process or in-process: the summary's bug and finding, their titles, the saved case and the text
summary carry it, and so do ``replay`` and ``repro``'s ISSUE.md. Naming never costs the finding: a worker that dies
while the models run, or flashcheck failing there, leaves a note."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from flashcheck.cli import main

K = "tests.cli._planted"
NAMED = "acc_not_rescaled"
LINE = "matches acc_not_rescaled: the kernel does not rescale the accumulator when the running max grows"


def fuzz(folder: Path, kernel: str, *extra) -> tuple[int, dict, str]:
    """``(exit status, JSON summary, printed text)`` of a small CPU campaign of ``kernel``."""
    out, printed = folder / "summary.json", io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["fuzz", f"{K}:{kernel}", "--device", "cpu", "--preset", "smoke", "--seed", "1", "--max-examples",
                     "10", "--corpus", str(folder / "corpus"), "--json", str(out), "--no-progress", *extra])
    return code, json.loads(out.read_text()), printed.getvalue()


@pytest.fixture(scope="module", params=["worker", "in-process"])
def campaign(request, tmp_path_factory):
    extra = ("--no-isolation",) if request.param == "in-process" else ()
    return fuzz(tmp_path_factory.mktemp(request.param), "acc_not_rescaled", *extra)


def _shrunk(summary: dict) -> dict:
    return next(f for f in summary["findings"] if f["shrunk"])


def test_the_distinct_bug_and_its_shrunk_finding_name_the_model(campaign):
    code, summary, _ = campaign
    assert code == 1 and summary["verdict"] == "BUG"
    [bug] = summary["bugs"]
    assert bug["cause"] == "numerical:out" and bug["model"]["named"] == NAMED, bug["model"]
    assert bug["title"].endswith(f"; matches {NAMED}") and bug["model"]["line"].startswith(LINE)
    shrunk = _shrunk(summary)
    assert bug["smallest"]["path"] == shrunk["path"] and shrunk["model"] == bug["model"]
    assert shrunk["title"] == bug["title"]
    # once a bug, on its smallest case: the case as found stays unnamed
    assert all("model" not in f for f in summary["findings"] if not f["shrunk"])
    provenance = json.loads(Path(shrunk["path"]).read_text())["provenance"]
    assert provenance["model"]["named"] == NAMED
    assert summary["time_split_s"]["models"] > 0


def test_the_text_summary_prints_the_line_under_the_bug(campaign):
    _, _, printed = campaign
    flat = " ".join(printed.split())
    assert "[numerical:out] out over the error budget" in flat and f"; matches {NAMED}" in flat
    assert LINE in flat
    assert flat.index(LINE) < flat.index("raw findings")  # under the distinct bug, before the raw findings


def test_replay_prints_the_line_and_writes_it(campaign, tmp_path):
    path = _shrunk(campaign[1])["path"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["replay", path, "--device", "cpu", "--json", str(tmp_path / "v.json")]) == 1
    lines = printed.getvalue().splitlines()
    assert lines[0].startswith("BUG: ") and lines[-1].startswith(LINE)
    written = json.loads((tmp_path / "v.json").read_text())
    assert written["status"] == "BUG" and written["model"]["named"] == NAMED


def test_repro_writes_the_defect_model_section(campaign, tmp_path):
    path = _shrunk(campaign[1])["path"]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["repro", path, "--device", "cpu", "--out", str(tmp_path)]) == 0
    assert LINE in printed.getvalue()
    issue = (tmp_path / "ISSUE.md").read_text()
    section = issue[issue.index("## Defect model"):issue.index("## Reproducer")]
    assert f"> {LINE}" in section and f"| {NAMED} | bitwise | 100% |" in section


def test_a_worker_that_dies_while_the_models_run_leaves_the_finding_and_a_note(tmp_path):
    code, summary, printed = fuzz(tmp_path, "dies_while_named")
    assert code == 1 and summary["verdict"] == "BUG"
    [bug] = summary["bugs"]  # no crash finding: the death was not the case's
    assert bug["cause"] == "numerical:out" and bug["kinds"] == ["over_budget"]
    assert bug["model"]["named"] is None and "not run: the worker process died (exit code 3)" in bug["model"]["note"]
    shrunk = _shrunk(summary)
    assert Path(shrunk["path"]).is_file() and shrunk["model"] == bug["model"]
    assert summary["worker_restarts"] == 0  # the next case would start a fresh worker; none came
    assert "defect models: not run: the worker process died" in " ".join(printed.split())


def test_flashcheck_failing_while_the_models_run_is_a_note_not_a_finding(tmp_path, monkeypatch):
    from flashcheck.defects import naming

    def broken(*args, **kwargs):
        raise RuntimeError("a defect of flashcheck's matching")

    monkeypatch.setattr(naming, "explain", broken)
    code, summary, _ = fuzz(tmp_path, "acc_not_rescaled", "--no-isolation")
    assert code == 1 and [b["kinds"] for b in summary["bugs"]] == [["over_budget"]]
    note = summary["bugs"][0]["model"]["note"]
    assert note == "not run: flashcheck failed while matching (RuntimeError: a defect of flashcheck's matching)"
    assert all(f["kinds"] == ["over_budget"] for f in summary["findings"])
