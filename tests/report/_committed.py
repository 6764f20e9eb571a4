"""The sign-off reports committed under reports/: each keeps its report.json gzipped (reports/README.md), and
``flashcheck report`` reads the file itself, so a test unpacks it into a folder of its own."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def _report_bytes(folder: str) -> bytes:
    return gzip.decompress((REPORTS / folder / "report.json.gz").read_bytes())


def committed_report(folder: str) -> dict:
    """The report.json of ``reports/<folder>``."""
    return json.loads(_report_bytes(folder))


def unpacked(folder: str, into: Path) -> Path:
    """``into`` holding the report.json of ``reports/<folder>``, as ``flashcheck signoff`` wrote it."""
    into.mkdir(parents=True, exist_ok=True)
    (into / "report.json").write_bytes(_report_bytes(folder))
    return into
