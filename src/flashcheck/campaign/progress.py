"""A campaign's progress, kept in its corpus folder beside the cases it saved, so that a campaign whose driver died
is resumed by the next run of the same command instead of judged again from its first case.

``fuzz --jobs N`` and ``--cluster`` (:mod:`.scheduler.seeds`) keep it under ``CORPUS/.progress/KEY/``, KEY a hash
of what fixes the campaign's cases (:func:`campaign_key`). Each run of a worker's share writes two files there
itself, on whichever node it runs (the corpus is a folder every node reaches):

- ``worker{i}.{g}.log``: run g of worker i's share (0 first; a worker in place of a lost one, or a resumed
  campaign, g + 1), one JSON line per drawn case as it is counted (``{"drawn": its line in the case log}``)
  and per finding as it is saved (``{"finding": its summary entry}``), each written through at once;
- ``worker{i}.{g}.json``: its latest progress snapshot (at most every half second) and, at its end, its summary.

The driver adds ``lost.log``: what the summary says of each run that ended before its share was done, as it learns
it (:func:`record_loss`), so that a driver that resumes the campaign says it too.

The driver marks the record ``done`` when it ends with a summary (interrupted or not): the same command run again
then starts afresh (the record replaced), and draws the same cases again. A record without the mark is one whose
driver died (SIGKILL, its machine lost): the next driver of the same campaign reads it back
(:func:`unfinished_runs`) and resumes it.

Readable without torch or hypothesis, as the driver is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from .result import keep_finding
from .summary import CampaignSummary

__all__ = ["RecordedRun", "RunRecord", "campaign_key", "mark_done", "progress_folder", "read_losses", "read_runs",
           "record_loss", "unfinished_runs"]

PROGRESS = ".progress"
DONE = "done"  # the mark of a record whose driver ended with the campaign's summary


def campaign_key(config, jobs: int) -> str:
    """What fixes a campaign's cases, hashed: the same command gives the same key."""
    target, limits = config.target, config.limits
    fixed = {"kernel": target.kernel, "options": target.kernel_options, "device": str(target.device),
             "preset": target.preset.name, "dtypes": target.dtypes, "backward": target.backward,
             "seed": config.drawing.seed, "max_examples": config.max_examples, "time_budget": config.time_budget,
             "keep_going": limits.keep_going, "jobs": jobs}
    return hashlib.sha256(json.dumps(fixed, sort_keys=True, default=str).encode()).hexdigest()[:16]


def progress_folder(corpus, key: str) -> Path:
    return Path(corpus) / PROGRESS / key


def mark_done(folder: Path) -> None:
    """The campaign ended with its summary: nothing to resume (the record stays, to read, until the next run)."""
    if folder.is_dir():
        (folder / DONE).touch()


def unfinished_runs(folder: Path) -> list:
    """The runs of a campaign whose driver died, to resume; none where its record is done (then removed: the
    campaign starts afresh) or there is none."""
    if (folder / DONE).exists():
        shutil.rmtree(folder, ignore_errors=True)
    return read_runs(folder)


def record_loss(folder: Path, entry: dict) -> None:
    """A run's loss, as the summary's ``lost`` has it (the driver's side)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lost.log", "a") as log:
        log.write(json.dumps(entry, default=str) + "\n")


def read_losses(folder: Path) -> dict:
    """The losses :func:`record_loss` wrote, by the name of the run lost."""
    log = folder / "lost.log"
    entries = [_json(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return {e["worker"]: e for e in entries if "worker" in e}


class RunRecord:
    """What one run of a worker's share writes, as it goes (the worker's side)."""

    def __init__(self, folder: str | Path, index: int, generation: int):
        stem = Path(folder) / f"worker{index}.{generation}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        self.log = open(f"{stem}.log", "a", buffering=1)  # each line through to the file as it ends
        self.state = Path(f"{stem}.json")

    def drawn(self, line: str) -> None:
        self._line({"drawn": line})

    def finding(self, entry: dict) -> None:
        self._line({"finding": entry})

    def _line(self, data: dict) -> None:
        self.log.write(json.dumps(data, default=str) + "\n")

    def snapshot(self, summary: CampaignSummary, *, final: bool = False) -> None:
        """Its counts so far (``final``: its summary), in place of the ones before (a reader never sees half)."""
        partial = self.state.with_suffix(".json.partial")
        partial.write_text(json.dumps({"final": final, "summary": summary.as_dict()}, default=str))
        os.replace(partial, self.state)

    def close(self) -> None:
        self.log.close()


@dataclass
class RecordedRun:
    """What a run of worker ``index``'s share left in the record."""

    index: int
    generation: int
    drawn: list = field(default_factory=list)     # its drawn cases' lines in the case log, in order
    findings: list = field(default_factory=list)  # every finding entry it saved
    snapshot: CampaignSummary | None = None       # its latest snapshot, or its summary where ``final``
    final: bool = False


def read_runs(folder: Path) -> list[RecordedRun]:
    """Every run in the record at ``folder``, by worker and then by run; none where there is no record."""
    runs = []
    for log in sorted(Path(folder).glob("worker*.log")):
        index, generation = (int(x) for x in log.stem.removeprefix("worker").split("."))
        run = RecordedRun(index, generation)
        for line in log.read_text().splitlines():
            data = _json(line)  # a line cut short by a kill is left out
            if "drawn" in data:
                run.drawn.append(data["drawn"])
            elif "finding" in data:
                keep_finding(run.findings, data["finding"])
        state = _json(log.with_suffix(".json").read_text() if log.with_suffix(".json").is_file() else "")
        if "summary" in state:
            run.snapshot, run.final = CampaignSummary.from_dict(state["summary"], str(log)), state["final"]
        runs.append(run)
    return sorted(runs, key=lambda r: (r.index, r.generation))


def _json(text: str) -> dict:
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
