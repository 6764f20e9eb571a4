"""Paths that flashcheck writes and prints.

Output paths are checked before any work starts: a campaign that runs for an hour and then cannot write
its summary has lost its result. Each check creates the folder and a probe file in it (then removes the
probe), so what it accepts can really be written, whoever runs it. :func:`replay_command` is the one
command every summary, report and failing test prints for a saved case."""

from __future__ import annotations

import os
import shlex
import tempfile
from pathlib import Path

from .errors import InvalidArgument

__all__ = ["check_writable_file", "check_writable_folder", "replay_command"]


def _probe(option: str, value, folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".flashcheck-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InvalidArgument(option, str(value), f"cannot write in {str(folder)!r} ({exc.strerror or exc})",
                              f"Pass a {option} path in a folder you can write to.") from None


def check_writable_folder(option: str, path) -> Path:
    """``path`` as a folder that exists (created if need be) and can be written, else a usage error."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InvalidArgument(option, str(path), "is an existing file, not a folder",
                              f"Pass a new or existing folder to {option}.")
    _probe(option, path, folder)
    return folder


def check_writable_file(option: str, path) -> Path | None:
    """``path`` as a file that can be written (its folder created if need be), else a usage error;
    None passes through (the option was not given)."""
    if path is None:
        return None
    file = Path(path)
    if file.is_dir():
        raise InvalidArgument(option, str(path), "is a folder, not a file",
                              f"Pass a file name to {option}, e.g. {file / 'summary.json'}.")
    _probe(option, path, file.parent)
    if file.exists() and not os.access(file, os.W_OK):
        raise InvalidArgument(option, str(path), "exists and cannot be written",
                              f"Pass another {option} path, or make that file writable.")
    return file


def replay_command(path, *, device: str | None = None) -> str:
    """The shell command that replays the case saved at ``path`` (as seen from where it is run) on the
    device it was found on; the case itself records how to reach its kernel."""
    on = ["--device", device.split(":")[0]] if isinstance(device, str) and device else []  # merged: a list
    words = ["flashcheck", "replay", str(path)] + on
    return " ".join(shlex.quote(w) for w in words)
